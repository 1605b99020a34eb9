/* The usual HTTP/1.x response's framing, read without the interpreter (see _engine.h). */
#include "_engine.h"


static int
is_space(char ch)
{
    /* bytes.strip()'s whitespace */
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\x0b' || ch == '\x0c';
}

static void
strip(const char *s, size_t *a, size_t *b)
{
    while (*a < *b && is_space(s[*a]))
        *a += 1;
    while (*b > *a && is_space(s[*b - 1]))
        *b -= 1;
}

/* Where `needle` is in lower[from:len], or -1. */
static Py_ssize_t
find(const char *lower, size_t len, size_t from, const char *needle)
{
    size_t nlen = strlen(needle);
    if (from > len)
        return -1;
    const char *at = memmem(lower + from, len - from, needle, nlen);
    return at == NULL ? -1 : (Py_ssize_t)(at - lower);
}

/* The end of the line starting at `from` in lower[:len]: the next CRLF or len. */
static size_t
line_end(const char *lower, size_t len, size_t from)
{
    Py_ssize_t end = find(lower, len, from, "\r\n");
    return end < 0 ? len : (size_t)end;
}

/* The usual response, read without the interpreter; P_DELEGATE for anything else. */
int
parse_fast(Engine *e, const char *buf, size_t len, int eof, int no_body, Parsed *p)
{
    const char *sep = memmem(buf, len, "\r\n\r\n", 4);
    if (sep == NULL)
        return eof ? P_DELEGATE : P_MORE;
    size_t hlen = (size_t)(sep - buf);
    if (hlen < 12 || memcmp(buf, "HTTP/1.", 7) != 0 || buf[8] != ' ' ||
        buf[9] < '0' || buf[9] > '9' || buf[10] < '0' || buf[10] > '9' || buf[11] < '0' || buf[11] > '9' ||
        (hlen > 12 && buf[12] != ' ' && buf[12] != '\r'))
        return P_DELEGATE;   /* the Python parser says what is wrong, in its words */
    int status = (buf[9] - '0') * 100 + (buf[10] - '0') * 10 + (buf[11] - '0');
    if (status >= 100 && status < 200 && status != 101)
        return P_DELEGATE;   /* an interim response: the real one follows */
    if (hlen > e->lower_cap) {
        size_t cap = hlen + 1024;
        char *lower = realloc(e->lower, cap);
        if (lower == NULL)
            return P_DELEGATE;
        e->lower = lower;
        e->lower_cap = cap;
    }
    char *lower = e->lower;
    for (size_t k = 0; k < hlen; k++) {
        char ch = buf[k];
        lower[k] = (ch >= 'A' && ch <= 'Z') ? (char)(ch + 32) : ch;
    }
    if (find(lower, hlen, 0, "\r\ntransfer-encoding:") >= 0)
        return P_DELEGATE;   /* chunked (or not): rare on this path, the Python parser reads it */
    size_t body_start = hlen + 4;
    int has_length = 0;
    size_t length = 0;
    Py_ssize_t at = find(lower, hlen, 0, "\r\ncontent-length:");
    if (at >= 0) {
        size_t a = (size_t)at + 17, b = line_end(lower, hlen, a);
        strip(lower, &a, &b);
        if (a == b || b - a > 15)
            return P_DELEGATE;   /* empty, or past any buffer: the Python parser decides */
        for (size_t k = a; k < b; k++) {
            if (lower[k] < '0' || lower[k] > '9')
                return P_DELEGATE;
            length = length * 10 + (size_t)(lower[k] - '0');
        }
        has_length = 1;
    }
    at = find(lower, hlen, 0, "\r\nconnection:");
    int keep;
    if (at >= 0) {
        size_t a = (size_t)at + 13, b = line_end(lower, hlen, a);
        const char *word = buf[7] == '1' ? "close" : "keep-alive";
        int has = memmem(lower + a, b - a, word, strlen(word)) != NULL;
        keep = buf[7] == '1' ? !has : has;
    }
    else {
        keep = buf[7] == '1';   /* HTTP/1.1: kept alive unless the server says close */
    }
    p->st_off = -1;
    p->st_len = 0;
    if (e->timing) {
        at = find(lower, hlen, 0, "\r\nserver-timing:");
        if (at >= 0) {
            size_t a = (size_t)at + 16, b = line_end(lower, hlen, a);
            if (find(lower, hlen, b, "\r\nserver-timing:") >= 0)
                return P_DELEGATE;   /* several: joined by the Python parser */
            strip(buf, &a, &b);
            p->st_off = (Py_ssize_t)a;
            p->st_len = (Py_ssize_t)(b - a);
        }
    }
    p->status = status;
    p->keep = keep;
    p->start = body_start;
    if (no_body || status == 204 || status == 304) {
        p->end = body_start;
        return P_DONE;
    }
    if (has_length) {
        if (length > MAX_RESPONSE)
            return P_DELEGATE;
        p->end = body_start + length;
        if (len < p->end)
            return eof ? P_DELEGATE : P_PENDING;
        return P_DONE;
    }
    /* No length: the body runs to the connection's close. */
    if (!eof) {
        p->end = 0;   /* unknown */
        p->keep = 0;
        return P_PENDING;
    }
    p->end = len;
    p->keep = 0;
    return P_DONE;
}
