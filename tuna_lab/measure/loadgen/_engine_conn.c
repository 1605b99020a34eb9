/* A connection's life (connect, send, read) and its request's row (see _engine.h). */
#include "_engine.h"

/* -- rows ------------------------------------------------------------------------------- */

static void
set_item(Engine *e, PyObject *list, Py_ssize_t i, PyObject *value)
{
    /* value is a new reference (or NULL: an exception is set) */
    if (value == NULL) {
        e->failed = 1;
        return;
    }
    PyList_SetItem(list, i, value);   /* steals it; i < n is checked by the caller's bounds */
}

static void
finished(Engine *e, Py_ssize_t i)
{
    e->in_flight[i] = 0;
    e->busy -= 1;
}

static void conn_close(Engine *e, Conn *c);

void
fail(Engine *e, Conn *c, Py_ssize_t i, const char *what, const char *why)
{
    char text[256];
    if (c != NULL)
        conn_close(e, c);
    if (i < 0 || i >= e->n)
        return;   /* never: only a connection carrying a request fails one; kept from writing outside the rows */
    snprintf(text, sizeof text, "%s%s", what, why);
    e->done[i] = now_mono() - e->t0;
    e->status[i] = -1;
    set_item(e, e->error, i, PyUnicode_DecodeLatin1(text, (Py_ssize_t)strlen(text), "replace"));
    finished(e, i);
}

/* -- connections ------------------------------------------------------------------------ */

/* A connection between requests: nothing read, nothing being framed, nothing left to send
 * (a new one, one kept alive for the next request, and one closed). */
static void
between_requests(Conn *c)
{
    c->len = 0;
    c->need = 0;
    c->head_valid = 0;
    c->out_pending = 0;
}

static int
watch(Engine *e, Conn *c, int mask)
{
    struct epoll_event ev;
    if (c->mask == mask)
        return 0;
    ev.events = (uint32_t)mask;
    ev.data.u64 = ((uint64_t)c->gen << 32) | (uint32_t)(c - e->conns);
    if (epoll_ctl(e->ep, c->mask ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &ev) != 0)
        return -1;
    c->mask = mask;
    return 0;
}

static void
conn_close(Engine *e, Conn *c)
{
    if (!c->in_use)
        return;
    /* Closing the last descriptor of a socket also removes it from the epoll set. */
    close(c->fd);
    c->fd = -1;
    c->i = -1;
    c->in_use = 0;
    c->gen += 1;
    c->mask = 0;
    between_requests(c);
    c->served = 0;
    if (c->cap > BUF_KEEP) {
        free(c->buf);
        c->buf = NULL;
        c->cap = 0;
    }
    e->free_slots[e->nfree++] = (int)(c - e->conns);
}

static void
idle_remove(Engine *e, Conn *c)
{
    int slot = (int)(c - e->conns);
    for (int k = 0; k < e->nidle; k++) {
        if (e->idle[k] == slot) {
            memmove(e->idle + k, e->idle + k + 1, sizeof(int) * (size_t)(e->nidle - k - 1));
            e->nidle -= 1;
            return;
        }
    }
}


static void
broken(Engine *e, Conn *c, const char *what, const char *why);

void
connect_request(Engine *e, Py_ssize_t i)
{
    int fd = socket(e->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        fail(e, NULL, i, "socket: ", strerror(errno));
        return;
    }
    if (e->nfree == 0) {
        /* Never: at most `slots` connections are open. Kept as a refusal, not an overrun. */
        close(fd);
        fail(e, NULL, i, "socket: ", "no free connection slot");
        return;
    }
    if (e->nodelay) {
        /* A request of several segments must not wait for an ACK (Nagle). */
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    if (e->lowat > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &e->lowat, sizeof e->lowat);
    int err = 0;
    if (connect(fd, (struct sockaddr *)&e->addr, e->addrlen) != 0) {
        err = errno;
        if (err == EINTR)
            err = EINPROGRESS;   /* interrupted: the handshake goes on by itself (connect(2)) */
    }
    Conn *c = &e->conns[e->free_slots[--e->nfree]];
    c->in_use = 1;
    c->fd = fd;
    c->i = i;
    c->reused = 0;
    c->served = 0;
    c->mask = 0;
    between_requests(c);
    c->out_off = 0;
    if (err == 0 || err == EINPROGRESS)
        send_request(e, c, 1);
    else
        fail(e, c, i, "connect: ", strerror(err));
}

void
send_request(Engine *e, Conn *c, int connecting)
{
    Py_ssize_t r = c->i % e->nreq;
    const char *out = e->req[r];
    size_t len = e->req_len[r], off = c->out_pending ? c->out_off : 0;
    if (off > len)
        off = len;   /* never: the offset only grows by what send() took */
    ssize_t sent;
    do {
        sent = send(c->fd, out + off, len - off, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    if (sent < 0) {
        int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK || err == EALREADY || err == EINPROGRESS ||
            (connecting && err == ENOTCONN)) {
            sent = 0;
        }
        else if (connecting) {
            fail(e, c, c->i, "connect: ", strerror(err));
            return;
        }
        else {
            broken(e, c, "send: ", strerror(err));
            return;
        }
    }
    off += (size_t)sent;
    if (off >= len) {
        c->out_pending = 0;
        c->out_off = 0;
        if (watch(e, c, EPOLLIN) != 0)
            fail(e, c, c->i, "epoll: ", strerror(errno));
    }
    else {
        c->out_pending = 1;
        c->out_off = off;
        if (watch(e, c, EPOLLOUT) != 0)
            fail(e, c, c->i, "epoll: ", strerror(errno));
    }
}

static void
broken(Engine *e, Conn *c, const char *what, const char *why)
{
    /* A kept-alive connection the server had closed before it saw the request: resend once
     * on a new one; else the request fails. */
    Py_ssize_t i = c->i;
    if (c->reused && c->len == 0 && i >= 0) {
        conn_close(e, c);
        connect_request(e, i);
        return;
    }
    fail(e, c, i, what, why);
}

void
writable(Engine *e, Conn *c)
{
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    if (err) {
        if (c->reused)
            broken(e, c, "send: ", strerror(err));
        else
            fail(e, c, c->i, "connect: ", strerror(err));
        return;
    }
    send_request(e, c, 0);
}

/* The Python parser on buf[:len]: P_MORE, P_DONE (p->body and p->st set) or P_ERROR (the
 * request failed, its error written); -1 with an exception set for anything but ValueError. */
static int
parse_python(Engine *e, Conn *c, int eof, int no_body, Parsed *p)
{
    PyObject *data = PyBytes_FromStringAndSize(c->buf, (Py_ssize_t)c->len);
    if (data == NULL)
        return -1;
    PyObject *res = PyObject_CallFunction(e->parse, "OOOO", data, eof ? Py_True : Py_False,
                                          no_body ? Py_True : Py_False, e->timing ? Py_True : Py_False);
    Py_DECREF(data);
    if (res == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            return -1;
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *text = value ? PyObject_Str(value) : NULL;
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        if (text == NULL)
            return -1;
        PyObject *why = PyUnicode_FromFormat("bad response: %U", text);
        Py_DECREF(text);
        if (why == NULL)
            return -1;
        Py_ssize_t i = c->i;
        conn_close(e, c);
        e->done[i] = now_mono() - e->t0;
        e->status[i] = -1;
        set_item(e, e->error, i, why);
        finished(e, i);
        return P_ERROR;
    }
    if (res == Py_None) {
        Py_DECREF(res);
        return P_MORE;
    }
    PyObject *body = NULL, *st = NULL;
    int status = 0, keep = 0;
    Py_ssize_t end = 0, start = 0;
    if (!PyArg_ParseTuple(res, "iOnpOn", &status, &body, &end, &keep, &st, &start)) {
        Py_DECREF(res);
        return -1;
    }
    if (body == Py_None) {
        Py_DECREF(res);
        return P_MORE;   /* its body still arriving: parsed again at the next read */
    }
    p->status = status;
    p->keep = keep;
    p->start = start < 0 ? 0 : (size_t)start;
    p->end = end < 0 ? c->len : (size_t)end;
    p->st_off = -1;
    Py_INCREF(body);
    p->body = body;
    if (st != Py_None) {
        Py_INCREF(st);
        p->st = st;
    }
    Py_DECREF(res);
    return P_DONE;
}

/* Response p has arrived on c: its row; the connection kept idle or closed. */
static void
answered(Engine *e, Conn *c, Parsed *p, int eof)
{
    Py_ssize_t i = c->i;
    int lowat = e->lowat;
    if (lowat >= 0) {
        /* SO_RCVLOWAT: see wire._Engine (one wake per answer from a server that closes) */
        if (p->keep)
            e->lowat = -1;
        else if (p->end > p->start && (lowat == 0 || (Py_ssize_t)p->start < (Py_ssize_t)lowat - 1))
            e->lowat = (int)(p->start + 1 > INT32_MAX ? INT32_MAX : p->start + 1);
    }
    e->done[i] = now_mono() - e->t0;
    e->status[i] = p->status;
    PyObject *body = p->body;
    if (body == NULL) {
        size_t a = p->start, b = p->end;
        if (b > c->len)
            b = c->len;
        if (a > b)
            a = b;
        body = PyBytes_FromStringAndSize(c->buf + a, (Py_ssize_t)(b - a));
    }
    p->body = NULL;
    set_item(e, e->raw, i, body);
    if (e->st != NULL) {
        PyObject *st = p->st;
        p->st = NULL;
        if (st == NULL && p->st_off >= 0 && (size_t)(p->st_off + p->st_len) <= c->len)
            st = PyBytes_FromStringAndSize(c->buf + p->st_off, p->st_len);
        if (st != NULL)
            set_item(e, e->st, i, st);
    }
    Py_CLEAR(p->st);
    finished(e, i);
    c->served += 1;
    if (p->keep && p->end == c->len && !eof && (e->reuse < 0 || c->served < e->reuse)) {
        c->i = -1;
        between_requests(c);
        e->idle[e->nidle++] = (int)(c - e->conns);
    }
    else {
        conn_close(e, c);
    }
}

static void
parse(Engine *e, Conn *c, int eof)
{
    Parsed p = {0};
    int no_body = e->heads != NULL && e->heads[c->i % e->nreq];
    int r = parse_fast(e, c->buf, c->len, eof, no_body, &p);
    if (r == P_DELEGATE) {
        r = parse_python(e, c, eof, no_body, &p);
        if (r < 0) {
            e->failed = 1;
            return;
        }
        if (r == P_ERROR)
            return;
    }
    if (r == P_MORE)
        return;
    if (r == P_PENDING) {
        if (p.end > 0) {
            c->need = p.end;
            c->head_valid = 1;
            c->head_status = p.status;
            c->head_keep = p.keep;
            c->head_start = p.start;
            c->st_off = p.st_off;
            c->st_len = p.st_len;
        }
        return;
    }
    answered(e, c, &p, eof);
}

static int
grow(Conn *c)
{
    if (c->cap - c->len >= BUF_MIN_FREE)
        return 0;
    size_t cap = c->cap ? c->cap * 2 : BUF_START;
    if (cap > MAX_RESPONSE + BUF_MIN_FREE)
        return -1;
    char *buf = realloc(c->buf, cap);
    if (buf == NULL)
        return -1;
    c->buf = buf;
    c->cap = cap;
    return 0;
}

void
readable(Engine *e, Conn *c)
{
    if (grow(c) != 0) {
        if (c->i < 0) {
            idle_remove(e, c);
            conn_close(e, c);
        }
        else {
            fail(e, c, c->i, "recv: ", "response larger than the generator's buffer (1 GiB)");
        }
        return;
    }
    ssize_t got;
    do {
        got = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return;
        if (c->i < 0) {
            idle_remove(e, c);
            conn_close(e, c);
            return;
        }
        broken(e, c, "recv: ", strerror(errno));
        return;
    }
    if (c->i < 0) {
        /* An idle keep-alive connection the server closed (or wrote to): drop it. */
        idle_remove(e, c);
        conn_close(e, c);
        return;
    }
    if (got == 0) {
        if (c->len == 0)
            broken(e, c, "", "server closed the connection without a response");
        else
            parse(e, c, 1);
        return;
    }
    c->len += (size_t)got;
    if (c->need) {
        if (c->len < c->need)
            return;   /* a long body still arriving: no need to parse the headers again */
        if (c->head_valid) {
            Parsed p = {0};
            p.status = c->head_status;
            p.keep = c->head_keep;
            p.start = c->head_start;
            p.end = c->need;
            p.st_off = c->st_off;
            p.st_len = c->st_len;
            c->head_valid = 0;
            c->need = 0;
            answered(e, c, &p, 0);
            return;
        }
    }
    parse(e, c, 0);
}
