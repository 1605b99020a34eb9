"""Where an HTTP/1.x response ends and what it says: the load generator's response parser.

Split from :mod:`tuna_lab.measure.loadgen.wire` (which imports these names back); see its
docstring for how the engine uses them.
"""

from ..._checks import shorten

__all__ = ["parse_response"]

# What may follow a status code: a space before the reason, or the line's end.
_AFTER_CODE = (b" ", b"\r", b"")


def parse_response(buf, eof=False, head=False):
    """Where the first HTTP/1.x response in ``buf`` ends, and what it says.

    Handles ``Content-Length``, ``Transfer-Encoding: chunked``, bodies
    delimited by the connection's close and responses to ``HEAD`` (which have
    no body, whatever their headers say); skips interim ``1xx`` responses.

    Parameters
    ----------
    buf : bytes or bytearray
        Everything received on the connection since the request was sent.
    eof : bool
        Whether the server has closed the connection (no more bytes will come).
    head : bool
        Whether the request was a ``HEAD``.

    Returns
    -------
    tuple or None
        None while the headers are incomplete. Else ``(status, body, end,
        keep_alive)``: ``body`` is the (de-chunked) body as bytes, or None
        while it is incomplete; ``end`` is then how many bytes of ``buf`` the
        response takes, or -1 while unknown (chunked or close-delimited
        bodies); ``keep_alive`` whether the connection may carry the next
        request.

    Raises
    ------
    ValueError
        A malformed response, or one cut short by the connection's close.

    Examples
    --------
    >>> parse_response(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok")
    (200, b'ok', 40, True)
    >>> parse_response(b"HTTP/1.1 200 OK\\r\\nContent-Length: 5\\r\\n\\r\\nok")
    (200, None, 43, True)
    >>> parse_response(b"HTTP/1.1 200 OK\\r\\nContent-Length: 5\\r\\n\\r\\n", head=True)
    (200, b'', 38, True)
    """
    parsed = parse_buffer(buf, eof, head, False)
    return None if parsed is None else parsed[:4]


def _server_timing(raw, head, at):
    """The values of the ``Server-Timing`` headers of header block ``raw`` (``head`` is it lower-cased,
    ``at`` where the first is), joined by ``b", "``. ``raw`` and ``head`` have the same length."""
    values = []
    while at >= 0:
        at += 16
        end = head.find(b"\r\n", at)
        values.append((raw[at:] if end < 0 else raw[at:end]).strip())
        at = head.find(b"\r\nserver-timing:", at)
    return values[0] if len(values) == 1 else b", ".join(values)


def parse_buffer(buf, eof, no_body, timing):
    """:func:`parse_response` plus, when ``timing``, the raw Server-Timing value (or None) as a 5th item,
    and where the body starts as a 6th (the engine keeps it while a ``Content-Length`` body arrives)."""
    # Every statement here runs once a response (issue 50's profile: this function was a third of the
    # generator's bytecodes): each search is a C call whose argument parsing costs more than the
    # search, so the status line is read from the header block by position rather than found, and a
    # bytes buffer is sliced without a bytes() copy.
    start = 0
    while True:
        head_end = buf.find(b"\r\n\r\n", start)
        if head_end < 0:
            if eof:
                raise ValueError("connection closed before the response headers")
            return None
        raw = buf[start:head_end]
        if raw.__class__ is not bytes:
            raw = bytes(raw)
        # "HTTP/1.x NNN" then a space (a reason follows) or the line's end: read in place.
        if raw[:7] != b"HTTP/1." or raw[8:9] != b" " or not raw[9:12].isdigit() or raw[12:13] not in _AFTER_CODE:
            line_end = raw.find(b"\r\n")
            status_line = raw if line_end < 0 else raw[:line_end]
            raise ValueError(f"not an HTTP/1.x status line: {shorten(status_line.decode('latin-1'), 80)!r}")
        status = int(raw[9:12])
        head = raw.lower()
        body_start = head_end + 4
        if 100 <= status < 200 and status != 101:
            start = body_start  # an interim response: the real one follows
            continue
        # The three headers framing needs, found inline: a function call each costs more than the find.
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            length = None
        else:
            end = head.find(b"\r\n", at + 17)
            length = (head[at + 17:] if end < 0 else head[at + 17:end]).strip()
            if not length.isdigit():
                raise ValueError("bad Content-Length")
            length = int(length)
        # find(), not `in`: bytes.__contains__ first tries its argument as an int and formats a
        # TypeError it then drops (thousands of instructions, callgrind shows), on every response.
        chunked = head.find(b"\r\ntransfer-encoding:") >= 0 and \
            (_header(head, b"\r\ntransfer-encoding:") or b"").endswith(b"chunked")
        at = head.find(b"\r\nconnection:")
        if at >= 0 and head.startswith(b"\r\nconnection: close\r\n", at):
            keep = False    # what Gunicorn's sync workers say: one call instead of a search, a slice and a search
        elif raw[7:8] == b"1":
            # HTTP/1.1: kept alive unless the server says close.
            keep = at < 0 or (head[at + 13:] if (end := head.find(b"\r\n", at + 13)) < 0
                              else head[at + 13:end]).find(b"close") < 0
        else:
            keep = at >= 0 and (head[at + 13:] if (end := head.find(b"\r\n", at + 13)) < 0
                                else head[at + 13:end]).find(b"keep-alive") >= 0
        st = None
        if timing:
            at = head.find(b"\r\nserver-timing:")
            if at >= 0:
                # One such header (the usual case) inline; several are joined by _server_timing.
                end = head.find(b"\r\n", at + 16)
                if end < 0:
                    st = raw[at + 16:].strip()
                elif head.find(b"\r\nserver-timing:", end) < 0:
                    st = raw[at + 16:end].strip()
                else:
                    st = _server_timing(raw, head, at)
        if no_body or status == 204 or status == 304:
            return status, b"", body_start, keep, st, body_start
        if chunked:
            return (*_dechunk(buf, body_start, status, keep, eof), st, body_start)
        if length is not None:
            end = body_start + length
            if len(buf) < end:
                if eof:
                    raise ValueError("connection closed in the middle of the response")
                return status, None, end, keep, st, body_start
            body = buf[body_start:end]
            return status, body if body.__class__ is bytes else bytes(body), end, keep, st, body_start
        # No length: the body runs to the connection's close.
        if not eof:
            return status, None, -1, False, st, body_start
        return status, bytes(buf[body_start:]), len(buf), False, st, body_start


def _header(head, key):
    """The stripped value of header ``key`` (``b"\\r\\nname:"``) in lower-cased ``head``, or None."""
    at = head.find(key)
    if at < 0:
        return None
    at += len(key)
    end = head.find(b"\r\n", at)
    return (head[at:] if end < 0 else head[at:end]).strip()


def _dechunk(buf, pos, status, keep, eof):
    chunks = []
    while True:
        line_end = buf.find(b"\r\n", pos)
        if line_end < 0:
            break
        size_text = bytes(buf[pos:line_end]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ValueError("bad chunk size") from None
        pos = line_end + 2
        if size == 0:
            if buf[pos:pos + 2] == b"\r\n":
                return status, b"".join(chunks), pos + 2, keep
            trailers = buf.find(b"\r\n\r\n", pos)
            if trailers < 0:
                break
            return status, b"".join(chunks), trailers + 4, keep
        if len(buf) < pos + size + 2:
            break
        if buf[pos + size:pos + size + 2] != b"\r\n":
            raise ValueError("chunk not followed by CRLF")
        chunks.append(bytes(buf[pos:pos + size]))
        pos += size + 2
    if eof:
        raise ValueError("connection closed in the middle of the response")
    return status, None, -1, keep
