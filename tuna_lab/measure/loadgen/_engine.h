/* The load generator's send/receive loop in C (issue 50): what runs once per request.
 *
 * tuna_lab.measure.loadgen.wire.drive() decides what to send and keeps the Python loop as
 * the fallback; this module runs the same loop without the interpreter's ~50k instructions
 * a request: non-blocking sockets on one epoll, the pre-built request bytes sent as they
 * are, responses framed by Content-Length or the connection's close, every time read from
 * CLOCK_MONOTONIC (the clock of time.monotonic, so rows mean what the Python loop's mean).
 *
 * Anything unusual about a response (an interim 1xx, Transfer-Encoding, several
 * Server-Timing headers, a status line or Content-Length the fast path does not read,
 * a close before the end) is handed to the Python parser (response.parse_buffer) with
 * the bytes received so far: the same answer and the same error text as the Python loop,
 * at the Python loop's cost, for the rare response that needs it.
 *
 * Files: _engine.h (these types), _engine_http.c (the response's framing, no Python),
 * _engine_conn.c (a connection's life and its row), _engine.c (the loop and the module).
 *
 * The GIL is held except while waiting in epoll_wait (the Python loop holds it the same
 * way); every buffer is bounds-checked and grows on the heap up to MAX_RESPONSE.
 */
#ifndef TUNA_ENGINE_H
#define TUNA_ENGINE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

/* Bytes a connection's buffer starts with (a small model's response is ~330 bytes) and
 * the least free room before a recv: below it the buffer doubles. */
#define BUF_START 16384
#define BUF_MIN_FREE 4096
/* A buffer grown past this is freed when its connection closes (a large batch's answer). */
#define BUF_KEEP (1 << 20)
/* A response larger than this fails its request rather than take the machine's memory. */
#define MAX_RESPONSE ((size_t)1 << 30)
/* The longest epoll wait (clock.MAX_WAIT) and the events read per wait. */
#define MAX_WAIT 1.0
#define EVENTS 256
#define TIMER_SLOT 0xffffffffu

enum { P_MORE, P_DONE, P_PENDING, P_DELEGATE, P_ERROR };

typedef struct {
    int fd;
    Py_ssize_t i;            /* the request it carries, -1 when idle */
    uint32_t gen;            /* bumped at every close: a stale epoll event is recognised */
    int in_use, mask, reused;
    long served;             /* responses read on this connection */
    int out_pending;         /* part of the request still to send */
    size_t out_off;
    char *buf;
    size_t len, cap;
    /* A response whose headers are read and whose Content-Length body is still arriving. */
    int head_valid, head_status, head_keep;
    size_t need, head_start;
    Py_ssize_t st_off, st_len;
} Conn;

typedef struct {
    struct sockaddr_storage addr;
    socklen_t addrlen;
    int family;
    PyObject *requests;      /* tuple of bytes */
    Py_ssize_t nreq;
    const char **req;
    size_t *req_len;
    char *heads;             /* per request: a HEAD (no body); NULL when none is */
    Py_ssize_t n, slots;
    double timeout, deadline;
    long reuse;              /* < 0: as many as the server allows */
    int lowat, nodelay, timing;
    const double *schedule;  /* NULL: closed loop */
    double *sent, *done, *scheduled;
    int64_t *status;
    PyObject *raw, *error, *st;   /* lists of n */
    PyObject *parse;          /* response.parse_buffer */
    int ep, tfd;
    double armed;
    Conn *conns;
    int nconns;
    int *free_slots, nfree;
    int *idle, nidle;
    Py_ssize_t busy, oldest, nxt;
    char *in_flight;
    double t0;
    char *lower;              /* the header block lower-cased */
    size_t lower_cap;
    int failed;               /* a Python exception is set: leave the loop */
} Engine;

typedef struct {
    int status, keep;
    size_t start, end;       /* the body is buf[start:end] */
    Py_ssize_t st_off, st_len;   /* Server-Timing value in buf, st_off < 0: none */
    PyObject *body, *st;     /* set by the Python parser (new references), else NULL */
} Parsed;

static inline double
now_mono(void)
{
    /* CLOCK_MONOTONIC: time.monotonic's clock, and the lab server's */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* _engine_http.c */
int parse_fast(Engine *e, const char *buf, size_t len, int eof, int no_body, Parsed *p);
/* _engine_conn.c */
void fail(Engine *e, Conn *c, Py_ssize_t i, const char *what, const char *why);
void connect_request(Engine *e, Py_ssize_t i);
void send_request(Engine *e, Conn *c, int connecting);
void writable(Engine *e, Conn *c);
void readable(Engine *e, Conn *c);

#endif
