/* The load generator's send/receive loop in C (issue 50): what runs once per request.
 *
 * The loop and the module; see _engine.h for the whole.
 */
#include "_engine.h"

/* -- the loop --------------------------------------------------------------------------- */

static double
expire(Engine *e, double now)
{
    /* Fail the requests whose timeout is past; when the next one is due (-1: none in flight). */
    Py_ssize_t i = e->oldest;
    double timeout = e->t0 + e->timeout;
    while (i < e->nxt) {
        if (!e->in_flight[i]) {
            i += 1;
            continue;
        }
        double when = e->sent[i] + timeout;
        if (when > now) {
            e->oldest = i;
            return when;
        }
        Conn *c = NULL;
        for (int k = 0; k < e->nconns; k++) {
            if (e->conns[k].in_use && e->conns[k].i == i) {
                c = &e->conns[k];
                break;
            }
        }
        fail(e, c, i, "", "timeout");
        i += 1;
    }
    e->oldest = i;
    return -1.0;
}

static int
arm(Engine *e, double when)
{
    if (when == e->armed)
        return 0;
    struct itimerspec spec = {{0, 0}, {0, 0}};
    time_t sec = (time_t)when;
    long nsec = (long)((when - (double)sec) * 1e9);
    spec.it_value.tv_sec = sec;
    spec.it_value.tv_nsec = nsec < 1 ? 1 : (nsec > 999999999 ? 999999999 : nsec);
    if (timerfd_settime(e->tfd, TFD_TIMER_ABSTIME, &spec, NULL) != 0)
        return -1;
    e->armed = when;
    return 0;
}

static double
run_loop(Engine *e)
{
    struct epoll_event events[EVENTS];
    const double *schedule = e->schedule;
    double t0 = e->t0 = now_mono();
    double stop = t0 + e->deadline;
    Py_ssize_t nxt = 0, n = e->n;
    while (1) {
        double now = now_mono();
        while (nxt < n && e->busy < e->slots && (schedule == NULL || t0 + schedule[nxt] <= now)) {
            Py_ssize_t i = nxt++;
            e->nxt = nxt;   /* expire() scans up to it: a failure inside the send is in range */
            double t = e->sent[i] = now - t0;
            if (schedule == NULL)
                e->scheduled[i] = t;
            e->busy += 1;
            e->in_flight[i] = 1;
            if (e->nidle > 0) {
                Conn *c = &e->conns[e->idle[--e->nidle]];
                c->reused = 1;
                c->i = i;
                send_request(e, c, 0);
            }
            else {
                connect_request(e, i);
            }
            if (e->failed)
                return -1.0;
            now = now_mono();
        }
        e->nxt = nxt;
        if ((nxt >= n && e->busy == 0) || now >= stop)
            return now - t0;
        double due = -1.0;
        if (e->oldest < nxt) {
            due = e->sent[e->oldest] + t0 + e->timeout;
            if (due <= now) {
                expire(e, now);
                if (e->failed)
                    return -1.0;
                continue;   /* the slots it freed: send, or end the trial, before any wait */
            }
        }
        double wake = (due < 0.0 || due > stop) ? stop : due;
        if (schedule != NULL && nxt < n && e->busy < e->slots) {
            double send_at = t0 + schedule[nxt];
            if (arm(e, send_at) != 0) {
                PyErr_SetFromErrno(PyExc_OSError);
                e->failed = 1;
                return -1.0;
            }
            /* The timerfd wakes the loop at the send time; epoll's own timeout (whole ms,
             * rounded up) only bounds the timeouts. */
            if (send_at + 0.001 < wake)
                wake = send_at + 0.001;
        }
        double wait = wake - now;
        if (!(wait > 0.0))
            wait = 0.0;
        else if (wait > MAX_WAIT)
            wait = MAX_WAIT;
        int ms = (int)(wait * 1000.0);
        if ((double)ms < wait * 1000.0)
            ms += 1;   /* rounded up, as Python's epoll.poll does */
        int got;
        Py_BEGIN_ALLOW_THREADS
        got = epoll_wait(e->ep, events, EVENTS, ms);
        Py_END_ALLOW_THREADS
        if (got < 0) {
            if (errno == EINTR) {
                if (PyErr_CheckSignals() != 0) {
                    e->failed = 1;
                    return -1.0;
                }
                continue;
            }
            PyErr_SetFromErrno(PyExc_OSError);
            e->failed = 1;
            return -1.0;
        }
        for (int k = 0; k < got; k++) {
            uint64_t data = events[k].data.u64;
            uint32_t slot = (uint32_t)data, ev = events[k].events;
            if (slot == TIMER_SLOT || slot >= (uint32_t)e->nconns)
                continue;   /* the timer: its wake is all it is for */
            Conn *c = &e->conns[slot];
            if (!c->in_use || c->gen != (uint32_t)(data >> 32))
                continue;   /* a socket closed earlier in this batch */
            if (c->out_pending && (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
                writable(e, c);
            else if (ev & (EPOLLIN | EPOLLERR | EPOLLHUP))
                readable(e, c);
            if (e->failed)
                return -1.0;
        }
    }
}

/* -- the module ------------------------------------------------------------------------- */

static int
get_address(Engine *e, PyObject *address)
{
    int family;
    PyObject *sockaddr;
    if (!PyArg_ParseTuple(address, "iO", &family, &sockaddr))
        return -1;
    const char *host;
    int port;
    memset(&e->addr, 0, sizeof e->addr);
    e->family = family;
    if (family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&e->addr;
        if (!PyArg_ParseTuple(sockaddr, "si", &host, &port))
            return -1;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        if (port < 0 || port > 65535 || inet_pton(AF_INET, host, &a->sin_addr) != 1)
            goto bad;
        e->addrlen = sizeof *a;
        return 0;
    }
    if (family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&e->addr;
        unsigned int flow = 0, scope = 0;
        if (!PyArg_ParseTuple(sockaddr, "si|II", &host, &port, &flow, &scope))
            return -1;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        a->sin6_flowinfo = htonl(flow);
        a->sin6_scope_id = scope;
        char plain[64];
        /* a scoped literal (fe80::1%lo): the scope is already in the tuple */
        snprintf(plain, sizeof plain, "%s", host);
        char *pct = strchr(plain, '%');
        if (pct != NULL)
            *pct = '\0';
        if (port < 0 || port > 65535 || inet_pton(AF_INET6, plain, &a->sin6_addr) != 1)
            goto bad;
        e->addrlen = sizeof *a;
        return 0;
    }
bad:
    PyErr_SetString(PyExc_ValueError, "address must be (AF_INET or AF_INET6, a literal sockaddr)");
    return -1;
}

static int
get_array(PyObject *obj, Py_buffer *view, const char *fmt, Py_ssize_t n, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (f[0] == '<' || f[0] == '=' || f[0] == '@')
        f++;
    if (view->itemsize != 8 || strchr(fmt, f[0]) == NULL || f[1] != '\0' || view->len != n * 8) {
        PyErr_Format(PyExc_ValueError, "%s must be a contiguous array of %zd 8-byte items", name, n);
        PyBuffer_Release(view);
        view->obj = NULL;
        return -1;
    }
    return 0;
}

static void
engine_free(Engine *e)
{
    if (e->conns != NULL) {
        for (int k = 0; k < e->nconns; k++) {
            if (e->conns[k].in_use)
                close(e->conns[k].fd);
            free(e->conns[k].buf);
        }
    }
    if (e->ep >= 0)
        close(e->ep);
    if (e->tfd >= 0)
        close(e->tfd);
    free(e->conns);
    free(e->free_slots);
    free(e->idle);
    free(e->in_flight);
    free(e->req);
    free(e->req_len);
    free(e->heads);
    free(e->lower);
}

PyDoc_STRVAR(drive_doc,
"drive(address, requests, heads, limits, schedule, options, out, parse) -> (end, t0)\n\n"
"Run one trial in this thread (see tuna_lab.measure.loadgen.wire.drive, which checks the\n"
"arguments): address (family, sockaddr); requests a tuple of bytes; heads a tuple of bools\n"
"or None; limits (slots, timeout, deadline, reuse or -1); schedule a float64 array or None;\n"
"options (lowat, nodelay, timing); out (sent, done, scheduled, status: float64 / int64\n"
"arrays; raw, error, timing: lists, timing None when not kept); parse the Python parser.\n"
"Returns the seconds from the start to the trial's end and the start on CLOCK_MONOTONIC.");

static PyObject *
drive(PyObject *self, PyObject *args)
{
    PyObject *address, *requests, *heads, *schedule_obj, *parse;
    PyObject *sent_obj, *done_obj, *sched_obj, *status_obj, *raw, *error, *st;
    Py_ssize_t slots;
    double timeout, deadline;
    long reuse;
    int lowat, nodelay, timing;
    Engine e;
    memset(&e, 0, sizeof e);
    e.ep = e.tfd = -1;
    e.armed = -1.0;
    Py_buffer vsent = {0}, vdone = {0}, vsched = {0}, vstatus = {0}, vschedule = {0};
    PyObject *result = NULL;

    if (!PyArg_ParseTuple(args, "OO!O(nddl)O(ipp)(OOOOO!O!O)O:drive", &address, &PyTuple_Type, &requests,
                          &heads, &slots, &timeout, &deadline, &reuse, &schedule_obj, &lowat, &nodelay, &timing,
                          &sent_obj, &done_obj, &sched_obj, &status_obj, &PyList_Type, &raw, &PyList_Type, &error,
                          &st, &parse))
        return NULL;
    if (get_address(&e, address) != 0)
        return NULL;
    e.n = PyList_GET_SIZE(raw);
    e.nreq = PyTuple_GET_SIZE(requests);
    if (e.nreq < 1 || slots < 1 || slots > 1000000 || !(timeout > 0.0) || !(deadline > 0.0) ||
        PyList_GET_SIZE(error) != e.n || (st != Py_None && (!PyList_Check(st) || PyList_GET_SIZE(st) != e.n)) ||
        !PyCallable_Check(parse)) {
        PyErr_SetString(PyExc_ValueError, "drive: inconsistent arguments");
        return NULL;
    }
    e.requests = requests;
    e.slots = slots;
    e.timeout = timeout;
    e.deadline = deadline;
    e.reuse = reuse;
    e.lowat = lowat;
    e.nodelay = nodelay;
    e.timing = timing && st != Py_None;
    e.raw = raw;
    e.error = error;
    e.st = st == Py_None ? NULL : st;
    e.parse = parse;
    if (get_array(sent_obj, &vsent, "d", e.n, "sent") != 0 || get_array(done_obj, &vdone, "d", e.n, "done") != 0 ||
        get_array(sched_obj, &vsched, "d", e.n, "scheduled") != 0 ||
        get_array(status_obj, &vstatus, "qlL", e.n, "status") != 0)
        goto done;
    e.sent = vsent.buf;
    e.done = vdone.buf;
    e.scheduled = vsched.buf;
    e.status = vstatus.buf;
    if (schedule_obj != Py_None) {
        if (PyObject_GetBuffer(schedule_obj, &vschedule, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0)
            goto done;
        if (vschedule.itemsize != 8 || vschedule.len < e.n * 8) {
            PyErr_SetString(PyExc_ValueError, "schedule must be a float64 array of at least one time per request");
            goto done;
        }
        e.schedule = vschedule.buf;
    }
    e.req = calloc((size_t)e.nreq, sizeof *e.req);
    e.req_len = calloc((size_t)e.nreq, sizeof *e.req_len);
    if (heads != Py_None)
        e.heads = calloc((size_t)e.nreq, 1);
    e.nconns = (int)slots;
    e.conns = calloc((size_t)e.nconns, sizeof *e.conns);
    e.free_slots = calloc((size_t)e.nconns, sizeof(int));
    e.idle = calloc((size_t)e.nconns, sizeof(int));
    e.in_flight = calloc((size_t)(e.n > 0 ? e.n : 1), 1);
    if (!e.req || !e.req_len || (heads != Py_None && !e.heads) || !e.conns || !e.free_slots || !e.idle ||
        !e.in_flight) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t r = 0; r < e.nreq; r++) {
        PyObject *item = PyTuple_GET_ITEM(requests, r);
        if (!PyBytes_Check(item) || PyBytes_GET_SIZE(item) == 0) {
            PyErr_SetString(PyExc_TypeError, "requests must be non-empty bytes");
            goto done;
        }
        e.req[r] = PyBytes_AS_STRING(item);
        e.req_len[r] = (size_t)PyBytes_GET_SIZE(item);
        if (e.heads != NULL) {
            if (!PyTuple_Check(heads) || PyTuple_GET_SIZE(heads) != e.nreq) {
                PyErr_SetString(PyExc_ValueError, "heads must be a tuple of one bool per request");
                goto done;
            }
            e.heads[r] = (char)PyObject_IsTrue(PyTuple_GET_ITEM(heads, r));
        }
    }
    for (int k = 0; k < e.nconns; k++) {
        e.conns[k].fd = -1;
        e.conns[k].i = -1;
        e.free_slots[e.nfree++] = e.nconns - 1 - k;
    }
    e.ep = epoll_create1(EPOLL_CLOEXEC);
    if (e.ep < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    if (e.schedule != NULL) {
        e.tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        struct epoll_event ev;
        /* Edge-triggered: each expiry wakes the loop once, with no read() to clear it. */
        ev.events = EPOLLIN | EPOLLET;
        ev.data.u64 = TIMER_SLOT;
        if (e.tfd < 0 || epoll_ctl(e.ep, EPOLL_CTL_ADD, e.tfd, &ev) != 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
    }
    double end = run_loop(&e);
    if (!e.failed)
        result = Py_BuildValue("dd", end, e.t0);

done:
    engine_free(&e);
    if (vsent.obj) PyBuffer_Release(&vsent);
    if (vdone.obj) PyBuffer_Release(&vdone);
    if (vsched.obj) PyBuffer_Release(&vsched);
    if (vstatus.obj) PyBuffer_Release(&vstatus);
    if (vschedule.obj) PyBuffer_Release(&vschedule);
    return result;
}

PyDoc_STRVAR(frame_doc,
"frame(buf, eof, no_body, timing, parse) -> (parsed, delegated)\n\n"
"What the C loop makes of the bytes buf received for one request (the tests hold it to\n"
"response.parse_buffer): parsed as parse_buffer returns it (None while the headers are\n"
"incomplete), and whether the fast path handed buf to parse (the Python parser).");

static PyObject *
frame(PyObject *self, PyObject *args)
{
    Py_buffer b;
    int eof, no_body, timing;
    PyObject *parse, *res = NULL;
    if (!PyArg_ParseTuple(args, "y*pppO:frame", &b, &eof, &no_body, &timing, &parse))
        return NULL;
    Engine e;
    memset(&e, 0, sizeof e);
    e.timing = timing;
    Parsed p = {0};
    const char *buf = b.buf;
    int r = parse_fast(&e, buf, (size_t)b.len, eof, no_body, &p);
    free(e.lower);
    if (r == P_DELEGATE) {
        PyObject *got = PyObject_CallFunction(parse, "y#OOO", buf, b.len, eof ? Py_True : Py_False,
                                              no_body ? Py_True : Py_False, timing ? Py_True : Py_False);
        if (got != NULL)
            res = Py_BuildValue("(NO)", got, Py_True);
    }
    else if (r == P_MORE) {
        res = Py_BuildValue("(OO)", Py_None, Py_False);
    }
    else {
        PyObject *st = Py_None;
        if (p.st_off >= 0)
            st = PyBytes_FromStringAndSize(buf + p.st_off, p.st_len);
        else
            Py_INCREF(st);
        PyObject *body = Py_None;
        if (r == P_DONE)
            body = PyBytes_FromStringAndSize(buf + p.start, (Py_ssize_t)(p.end - p.start));
        else
            Py_INCREF(body);
        Py_ssize_t end = r == P_PENDING && p.end == 0 ? -1 : (Py_ssize_t)p.end;
        if (st != NULL && body != NULL) {
            /* N: the tuple takes body's and st's references */
            res = Py_BuildValue("((iNnONn)O)", p.status, body, end, p.keep ? Py_True : Py_False, st,
                                (Py_ssize_t)p.start, Py_False);
        }
        else {
            Py_XDECREF(body);
            Py_XDECREF(st);
        }
    }
    PyBuffer_Release(&b);
    return res;
}

static PyMethodDef methods[] = {
    {"drive", drive, METH_VARARGS, drive_doc},
    {"frame", frame, METH_VARARGS, frame_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_engine",
    .m_doc = "The load generator's per-request loop in C (see tuna_lab.measure.loadgen.wire).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__engine(void)
{
    return PyModule_Create(&module);
}
