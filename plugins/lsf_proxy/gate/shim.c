/* The compiled shim: shim.py's common path with no interpreter to start.
 *
 * `gridgate gate --install-shims --compiled` builds this file once per command, with the
 * command's settings as C literals in a header of their own (gate.py writes it; every byte of
 * text outside [A-Za-z0-9 /._-] is an octal escape, so no setting is read as C). A granted call
 * costs about what exec'ing the real command costs; everything rarer execs the Python shim
 * written beside it (GG_FALLBACK), which has the whole gate: a config file changed since install,
 * a call inside a gated command (a ride on its token), a daemon the settings name by a relative
 * path or $GRIDGATE_PROXYD_SOCKET, a reply it cannot read, and every refusal (the Python shim
 * asks again and words it: a refusal is immediate, so nothing is waited for twice).
 *
 * What it does is shim.py's main(), step for step: a random rotation over the daemons'
 * Unix sockets; a holder process forked while the daemon decides, which gives the token back
 * when the command ends (or after the start hold); the notice after a second; busy daemons
 * passed over; denials retried with jittered back-off up to notoken_ntries; when_unavailable;
 * the grant's nice (and the caller's, with nice_caller); the token in the command's
 * environment unless it submits. Replies are read as JSON objects by a small reader that takes
 * the daemon's compact lines and refuses anything else (then the Python shim reads it).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gg_settings.h" /* compiled.py writes it: the GG_* settings of one command */

extern char **environ;

#define EXIT_NO_TOKEN 75
#define EXIT_UNAVAILABLE 69
#define TOKEN_ENV "GRIDGATE_GATE_TOKEN"

static const char MARK[] __attribute__((used)) = "gridgate gate shim (compiled)";

static char **args; /* the real command's argv: GG_REAL, then the shim's own arguments */

__attribute__((format(printf, 1, 2)))
static void say(const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof line)
        n = sizeof line - 1;
    dprintf(2, "gridgate gate: %.*s\n", n, line);
}

/* The Python shim, with the same arguments: it has the whole gate. */
static int fallback(char **argv) {
    argv[0] = (char *)GG_FALLBACK;
    execv(GG_FALLBACK, argv);
    say("%s: cannot run %s: %s", GG_NAME, GG_FALLBACK, strerror(errno));
    return 126;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double rand01(void) {
    unsigned int r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
        r = (unsigned int)getpid() * 2654435761u;
    return (double)r / 4294967296.0;
}

/* ---- the reply reader: one JSON object per line, as the daemon writes them ---- */

struct reply {
    int has_id, id, ok, refused, nice, has_nice, request, ahead, has_ahead;
    char result[64], reason[64], token[256], event[32], code[64];
};

struct cursor {
    const char *p, *end;
};

static void blank(struct cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r'))
        c->p++;
}

/* A string without escapes into out (NULL: skipped, escapes allowed). 0, or -1: not one. */
static int string(struct cursor *c, char *out, size_t size) {
    if (c->p >= c->end || *c->p != '"')
        return -1;
    const char *start = ++c->p;
    int escaped = 0;
    while (c->p < c->end && *c->p != '"') {
        if ((unsigned char)*c->p < 0x20)
            return -1;
        if (*c->p == '\\') {
            escaped = 1;
            if (++c->p >= c->end)
                return -1;
        }
        c->p++;
    }
    if (c->p >= c->end)
        return -1;
    size_t n = (size_t)(c->p - start);
    c->p++;
    if (out == NULL)
        return 0;
    if (escaped || n >= size)
        return -1; /* the Python shim reads it */
    memcpy(out, start, n);
    out[n] = '\0';
    return 0;
}

/* An integer (-1: not one, or a fraction/exponent: a float, kept out of *out). */
static int number(struct cursor *c, long *out, int *integral) {
    const char *start = c->p;
    if (c->p < c->end && *c->p == '-')
        c->p++;
    if (c->p >= c->end || *c->p < '0' || *c->p > '9')
        return -1;
    while (c->p < c->end && ((*c->p >= '0' && *c->p <= '9') || (*c->p && strchr(".eE+-", *c->p))))
        c->p++;
    char text[32];
    size_t n = (size_t)(c->p - start);
    if (n >= sizeof text)
        return -1;
    memcpy(text, start, n);
    text[n] = '\0';
    char *rest;
    errno = 0;
    long value = strtol(text, &rest, 10);
    *integral = (*rest == '\0' && errno == 0);
    if (*integral) {
        *out = value;
        return 0;
    }
    double f = strtod(text, &rest);
    return (*rest == '\0') ? (void)f, 0 : -1;
}

static int value(struct cursor *c, int depth);

/* An object; in the top one (and its "error"), the keys the shim reads go into r. */
static int object(struct cursor *c, int depth, struct reply *r, int in_error) {
    char key[32];
    c->p++; /* '{' */
    blank(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return 0;
    }
    for (;;) {
        blank(c);
        const char *at = c->p;
        if (string(c, key, sizeof key) != 0) {
            c->p = at;
            if (string(c, NULL, 0) != 0)
                return -1;
            key[0] = '\0';
        }
        blank(c);
        if (c->p >= c->end || *c->p != ':')
            return -1;
        c->p++;
        blank(c);
        if (c->p >= c->end)
            return -1;
        char *text = NULL;
        size_t size = 0;
        int *whole = NULL, *seen = NULL;
        if (r != NULL && !in_error) {
            if (!strcmp(key, "result"))
                text = r->result, size = sizeof r->result;
            else if (!strcmp(key, "reason"))
                text = r->reason, size = sizeof r->reason;
            else if (!strcmp(key, "token"))
                text = r->token, size = sizeof r->token;
            else if (!strcmp(key, "event"))
                text = r->event, size = sizeof r->event;
            else if (!strcmp(key, "nice"))
                whole = &r->nice, seen = &r->has_nice;
            else if (!strcmp(key, "request"))
                whole = &r->request;
            else if (!strcmp(key, "ahead"))
                whole = &r->ahead, seen = &r->has_ahead;
        } else if (r != NULL && !strcmp(key, "code")) {
            text = r->code, size = sizeof r->code;
        }
        if (r != NULL && !in_error && !strcmp(key, "id")) {
            /* an integer id; null or absent: none; anything else matches no request */
            long v;
            int integral = 0;
            r->has_id = 2;
            if (*c->p == '-' || (*c->p >= '0' && *c->p <= '9')) {
                if (number(c, &v, &integral) != 0)
                    return -1;
                if (integral && v > -1000000000L && v < 1000000000L)
                    r->has_id = 1, r->id = (int)v;
            } else {
                if (c->end - c->p >= 4 && !memcmp(c->p, "null", 4))
                    r->has_id = 0;
                if (value(c, depth + 1) != 0)
                    return -1;
            }
        } else if (text != NULL && *c->p == '"') {
            if (string(c, text, size) != 0)
                return -1;
        } else if (whole != NULL && (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))) {
            long v;
            int integral;
            if (number(c, &v, &integral) != 0)
                return -1;
            if (integral && v > -1000000000L && v < 1000000000L) {
                *whole = (int)v;
                if (seen != NULL)
                    *seen = 1;
            }
        } else if (r != NULL && !in_error && !strcmp(key, "ok") && *c->p != '{' && *c->p != '[') {
            if (c->end - c->p >= 4 && !memcmp(c->p, "true", 4))
                r->ok = 1;
            if (c->end - c->p >= 5 && !memcmp(c->p, "false", 5))
                r->refused = 1;
            if (value(c, depth + 1) != 0)
                return -1;
        } else if (r != NULL && !in_error && !strcmp(key, "error") && *c->p == '{') {
            if (depth > 16 || object(c, depth + 1, r, 1) != 0)
                return -1;
        } else if (value(c, depth + 1) != 0) {
            return -1;
        }
        blank(c);
        if (c->p >= c->end)
            return -1;
        if (*c->p == '}') {
            c->p++;
            return 0;
        }
        if (*c->p != ',')
            return -1;
        c->p++;
    }
}

static int value(struct cursor *c, int depth) {
    if (depth > 32 || c->p >= c->end)
        return -1;
    char ch = *c->p;
    if (ch == '"')
        return string(c, NULL, 0);
    if (ch == '{')
        return object(c, depth, NULL, 0);
    if (ch == '[') {
        c->p++;
        blank(c);
        if (c->p < c->end && *c->p == ']') {
            c->p++;
            return 0;
        }
        for (;;) {
            blank(c);
            if (value(c, depth + 1) != 0)
                return -1;
            blank(c);
            if (c->p >= c->end)
                return -1;
            if (*c->p == ']') {
                c->p++;
                return 0;
            }
            if (*c->p != ',')
                return -1;
            c->p++;
        }
    }
    static const char *const words[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(c->end - c->p) >= n && !memcmp(c->p, words[i], n)) {
            c->p += n;
            return 0;
        }
    }
    long v;
    int integral;
    return number(c, &v, &integral);
}

/* 0: line is one JSON object, its keys in r; -1: anything else. */
static int parse(const char *line, size_t n, struct reply *r) {
    struct cursor c = {line, line + n};
    memset(r, 0, sizeof *r);
    blank(&c);
    if (c.p >= c.end || *c.p != '{' || object(&c, 0, r, 0) != 0)
        return -1;
    blank(&c);
    return c.p == c.end ? 0 : -1;
}

/* ---- one connection to one daemon ---- */

enum outcome { GOT, BUSY, DOWN, UNREADABLE, REFUSED };

struct link {
    int fd;
    char buf[65536];
    size_t len;
    char why[512]; /* what went wrong, worded as shim.py's Link words it */
};

static enum outcome connect_to(struct link *l, const char *name, const char *path) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    l->len = 0;
    l->why[0] = '\0';
    if (strlen(path) >= sizeof addr.sun_path)
        return UNREADABLE; /* the Python shim says why */
    strcpy(addr.sun_path, path);
    /* not blocking while it connects: a full backlog is EAGAIN (busy), never a wait */
    l->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (l->fd < 0 || connect(l->fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        int err = errno;
        snprintf(l->why, sizeof l->why, "%s: cannot connect to %s: [Errno %d] %s", name, path,
                 err, strerror(err));
        if (l->fd >= 0)
            close(l->fd);
        l->fd = -1;
        return err == EAGAIN ? BUSY : DOWN;
    }
    fcntl(l->fd, F_SETFL, fcntl(l->fd, F_GETFL) & ~O_NONBLOCK);
    return GOT;
}

static int send_all(int fd, const char *data, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        data += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The reply to msg_id into r; the notice once after `notice` seconds (< 0: never). */
static enum outcome wait_reply(struct link *l, int msg_id, double timeout, double notice,
                               const char *category, struct reply *r) {
    double deadline = now() + timeout, notice_at = notice < 0 ? -1 : now() + notice;
    int ahead = -1;
    for (;;) {
        char *nl = memchr(l->buf, '\n', l->len);
        if (nl == NULL) {
            double t = now();
            if (t >= deadline) {
                snprintf(l->why, sizeof l->why, "no reply within %.0f s", timeout);
                return BUSY;
            }
            double limit = deadline - t;
            if (notice_at >= 0) {
                if (t >= notice_at) {
                    notice_at = -1;
                    if (ahead >= 0)
                        say("%s: waiting for a %s token, %d ahead", GG_NAME, category, ahead);
                    else
                        say("%s: waiting for a %s token", GG_NAME, category);
                    continue;
                }
                if (notice_at - t < limit)
                    limit = notice_at - t;
            }
            if (l->len == sizeof l->buf)
                return UNREADABLE;
            struct pollfd p = {.fd = l->fd, .events = POLLIN};
            int ready = poll(&p, 1, (int)(limit * 1000) + 1);
            if (ready < 0 && errno != EINTR) {
                snprintf(l->why, sizeof l->why, "%s", strerror(errno));
                return DOWN;
            }
            if (ready <= 0)
                continue;
            ssize_t got = recv(l->fd, l->buf + l->len, sizeof l->buf - l->len, 0);
            if (got < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            if (got <= 0) {
                snprintf(l->why, sizeof l->why, "%s",
                         got < 0 ? strerror(errno) : "the daemon closed the connection");
                return DOWN;
            }
            l->len += (size_t)got;
            continue;
        }
        size_t n = (size_t)(nl - l->buf);
        int bad = parse(l->buf, n, r);
        memmove(l->buf, nl + 1, l->len - n - 1);
        l->len -= n + 1;
        if (bad)
            return UNREADABLE;
        if (r->has_id == 1 && r->id == msg_id)
            return r->ok ? GOT : REFUSED;
        if (!strcmp(r->event, "queued") && r->request == msg_id)
            ahead = r->has_ahead ? r->ahead : -1;
        else if (r->has_id == 0 && r->refused) {
            if (!strcmp(r->code, "busy") || !strcmp(r->code, "auth_timeout")) {
                snprintf(l->why, sizeof l->why, "busy");
                return BUSY;
            }
            return REFUSED;
        }
    }
}

/* ---- the holder: gives the token back when the command ends (shim.py's Holder) ---- */

static pid_t holder_pid = -1;
static int holder_pipe = -1;

static void hold(int fd, const char *token, int watch, pid_t gate, double hold_for) {
    double deadline = hold_for < 0 ? -1 : now() + hold_for;
    for (;;) {
        double left = deadline < 0 ? -1 : deadline - now();
        if (left < 0 && deadline >= 0)
            left = 0;
        if (watch >= 0) {
            struct pollfd p = {.fd = watch, .events = POLLIN};
            int ready = poll(&p, 1, left < 0 ? -1 : (int)(left * 1000) + 1);
            if (ready > 0)
                break; /* the command ended */
            if (ready < 0 && errno != EINTR)
                break;
        } else {
            if (kill(gate, 0) != 0 && errno == ESRCH)
                break;
            double step = (left < 0 || left > 0.2) ? 0.2 : left;
            struct timespec ts = {0, (long)(step * 1e9)};
            nanosleep(&ts, NULL);
        }
        if (deadline >= 0 && now() >= deadline)
            break; /* a start-only command: its start is over */
    }
    char line[400];
    int n = snprintf(line, sizeof line, "{\"v\":1,\"id\":2,\"op\":\"release\",\"token\":\"%s\"}\n",
                     token);
    if (n > 0 && (size_t)n < sizeof line && send_all(fd, line, (size_t)n) == 0) {
        static struct link l;
        struct reply r;
        l.fd = fd;
        l.len = 0;
        wait_reply(&l, 2, GG_CONNECT_TIMEOUT, -1, "", &r);
    }
    close(fd); /* unanswered: the daemon takes the token back when the connection closes */
}

static void holder_start(int fd, double hold_for) {
    int pipefd[2];
    if (pipe(pipefd) != 0)
        return; /* no holder: the token goes back when this process's connection closes */
    pid_t gate = getpid();
#ifdef SYS_pidfd_open
    int watch = (int)syscall(SYS_pidfd_open, gate, 0);
#else
    int watch = -1; /* Linux before 5.3: poll the pid instead */
#endif
    pid_t pid = fork();
    if (pid == 0) {
        setsid();
        if (fork() == 0) {
            close(pipefd[1]);
            int null = open("/dev/null", O_RDWR);
            if (null >= 0) {
                dup2(null, 0);
                dup2(null, 1);
                dup2(null, 2);
            }
            char token[256];
            size_t len = 0;
            ssize_t got;
            while (len < sizeof token - 1 &&
                   ((got = read(pipefd[0], token + len, sizeof token - 1 - len)) > 0 ||
                    (got < 0 && errno == EINTR)))
                if (got > 0)
                    len += (size_t)got;
            token[len] = '\0';
            if (len > 0)
                hold(fd, token, watch, gate, hold_for);
        }
        _exit(0);
    }
    close(pipefd[0]);
    if (watch >= 0)
        close(watch);
    if (pid < 0) {
        close(pipefd[1]);
        return;
    }
    holder_pid = pid;
    holder_pipe = pipefd[1];
    fcntl(holder_pipe, F_SETFD, FD_CLOEXEC);
}

static void holder_abandon(void) {
    if (holder_pipe >= 0)
        close(holder_pipe); /* closed empty: the holder goes */
    holder_pipe = -1;
    if (holder_pid > 0)
        waitpid(holder_pid, NULL, 0);
    holder_pid = -1;
}

/* ---- the command ---- */

static void lower(pid_t pid, int nice) {
    errno = 0;
    int now_at = getpriority(PRIO_PROCESS, (id_t)pid);
    if (errno == 0 && now_at < nice)
        setpriority(PRIO_PROCESS, (id_t)pid, nice);
}

static int run(const char *token, const char *category) {
    if (holder_pid > 0)
        waitpid(holder_pid, NULL, 0); /* the command must not inherit a child of ours */
    holder_pid = -1;
    size_t n = 0;
    while (environ[n] != NULL)
        n++;
    char **env = calloc(n + 2, sizeof *env);
    if (env == NULL)
        return 126;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], TOKEN_ENV "=", sizeof TOKEN_ENV) != 0)
            env[k++] = environ[i];
    char carried[300];
    if (token[0] && strcmp(category, "submission") != 0 && !GG_SUBMITS) {
        snprintf(carried, sizeof carried, "%s=%s", TOKEN_ENV, token);
        env[k++] = carried;
    }
    env[k] = NULL;
    execve(GG_REAL, args, env);
    int err = errno;
    if (err == ENOENT) {
        say("%s: command not found", GG_NAME);
        return 127;
    }
    say("%s: cannot execute: %s", GG_NAME, strerror(err));
    return 126;
}

/* The category and request of this call: the first word that is not an option may decide. */
static void choose(int argc, char **argv, const char **category, const char **request) {
    *category = GG_CATEGORY;
    *request = GG_REQUEST;
    for (int i = 1; i < argc && GG_NWORDS > 0; i++) {
        if (argv[i][0] == '-')
            continue;
        for (int w = 0; w < GG_NWORDS; w++)
            if (!strcmp(argv[i], GG_WORDS[w])) {
                *category = GG_WORD_CATEGORIES[w];
                *request = GG_WORD_REQUESTS[w];
            }
        break;
    }
}

static int start_only(int argc, char **argv) {
    if (GG_NSTART < 0)
        return 0;
    if (GG_NSTART == 0)
        return 1;
    for (int i = 1; i < argc; i++)
        for (int f = 0; f < GG_NSTART; f++) {
            const char *flag = GG_START_FLAGS[f], *arg = argv[i];
            size_t n = strlen(flag);
            if (!strcmp(arg, flag))
                return 1;
            if (n > 2 && !strncmp(flag, "--", 2) && !strncmp(arg, flag, n) && arg[n] == '=')
                return 1;
            if (n == 2 && !strncmp(arg, flag, 2) && arg[2]) {
                const char *d = arg + 2;
                while (*d >= '0' && *d <= '9')
                    d++;
                if (*d == '\0')
                    return 1;
            }
        }
    return 0;
}

static int config_changed(void) {
    if (GG_CONFIG[0] == '\0')
        return 0;
    struct stat st;
    if (stat(GG_CONFIG, &st) != 0)
        return 1;
    long long now_sig[5] = {(long long)st.st_dev, (long long)st.st_ino, (long long)st.st_size,
                            (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec,
                            (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec};
    return memcmp(now_sig, GG_CONFIG_SIG, sizeof now_sig) != 0;
}

#define NMAX (GG_NDAEMONS > 0 ? GG_NDAEMONS : 1)
static const char *names[NMAX], *paths[NMAX], *listed = GG_DAEMON_LIST;
static int ndaemons = GG_NDAEMONS;

/* No socket in the settings: the runtime directory's, as shim.py's _daemons finds it. */
static int runtime_daemon(void) {
    static char path[sizeof ((struct sockaddr_un *)0)->sun_path], host[256];
    const char *runtime = getenv("XDG_RUNTIME_DIR");
    int n;
    if (geteuid() == 0 || runtime == NULL || runtime[0] == '\0')
        n = snprintf(path, sizeof path, "/run/gridgate/proxyd.sock");
    else if (runtime[0] != '/')
        return -1; /* relative to the working directory: the Python shim's */
    else
        n = snprintf(path, sizeof path, "%s/gridgate/proxyd.sock", runtime);
    if (n < 0 || (size_t)n >= sizeof path)
        return -1;
    struct utsname u;
    if (uname(&u) != 0)
        return -1;
    snprintf(host, sizeof host, "%s", u.nodename);
    host[strcspn(host, ".")] = '\0';
    names[0] = listed = host;
    paths[0] = path;
    ndaemons = 1;
    return 0;
}

int main(int argc, char **argv) {
    const char *given = getenv("GRIDGATE_PROXYD_SOCKET");
    const char *riding = getenv(TOKEN_ENV);
    if (GG_REAL[0] == '\0' || (given && given[0]) || (riding && riding[0] && !GG_SUBMITS) ||
        access(GG_REAL, X_OK) != 0 || config_changed())
        return fallback(argv);
    for (int d = 0; d < GG_NDAEMONS; d++)
        names[d] = GG_DAEMON_NAMES[d], paths[d] = GG_DAEMON_PATHS[d];
    if (GG_NDAEMONS == 0 && runtime_daemon() != 0)
        return fallback(argv);
    const char *category, *request;
    choose(argc, argv, &category, &request);
    args = calloc((size_t)argc + 1, sizeof *args);
    if (args == NULL)
        return fallback(argv);
    args[0] = (char *)GG_REAL;
    size_t size = strlen(GG_REAL) + 1;
    for (int i = 1; i < argc; i++) {
        args[i] = argv[i];
        size += strlen(argv[i]) + 1;
    }
    char line[1024];
    int len = snprintf(line, sizeof line, "%s%zu}\n", request, size);
    if (len < 0 || (size_t)len >= sizeof line)
        return fallback(argv);
    double hold_for = start_only(argc, argv) ? GG_START_HOLD : -1;
    const char *quiet = getenv("GRIDGATE_GATE_QUIET");
    double notice = (quiet && quiet[0]) ? -1 : 1.0;
    int down[NMAX];
    memset(down, 0, sizeof down);
    int tries = 0;
    static struct link l;
    for (;;) {
        int start = (int)(rand01() * ndaemons), order[NMAX], k = 0;
        for (int pass = 0; pass < 2; pass++) /* the rotation, daemons found down last */
            for (int i = 0; i < ndaemons; i++) {
                int d = (start + i) % ndaemons;
                if (down[d] == pass)
                    order[k++] = d;
            }
        const char *busy_by = NULL;
        struct reply r;
        int answered = -1;
        for (int i = 0; i < ndaemons && answered < 0; i++) {
            int d = order[i];
            const char *after = i + 1 < ndaemons ? "; trying the next" : "";
            enum outcome o = connect_to(&l, names[d], paths[d]);
            if (o == GOT && send_all(l.fd, line, (size_t)len) != 0) {
                snprintf(l.why, sizeof l.why, "%s", strerror(errno));
                o = DOWN;
            }
            if (o == GOT) {
                if (holder_pid < 0)
                    holder_start(l.fd, hold_for); /* forked while the daemon decides */
                o = wait_reply(&l, 1, GG_REPLY_TIMEOUT, notice, category, &r);
            }
            if (o == GOT) {
                down[d] = 0;
                answered = d;
                break;
            }
            if (l.fd >= 0)
                close(l.fd);
            l.fd = -1;
            holder_abandon();
            if (o == UNREADABLE || o == REFUSED)
                return fallback(argv); /* the Python shim asks again and says why */
            /* shim.py's words: the link's message names the daemon unless it came with one */
            const char *why = l.why, *who = names[d];
            int named = !strncmp(why, who, strlen(who)) && why[strlen(who)] == ':';
            if (o == DOWN) {
                say("warning: lsfproxyd %s did not answer: %s%s%s%s", who, named ? "" : who,
                    named ? "" : ": ", why, after);
                down[d] = 1;
                continue;
            }
            say("warning: lsfproxyd %s is overloaded: %s%s%s%s", who, named ? "" : who,
                named ? "" : ": ", why, after);
            if (busy_by == NULL)
                busy_by = names[d];
        }
        const char *result, *reason = "busy", *by = busy_by;
        if (answered >= 0) {
            result = r.result;
            reason = r.reason[0] ? r.reason : "denied";
            by = names[answered];
        } else if (busy_by != NULL) {
            result = "denied";
        } else {
            holder_abandon();
            if (!strcmp(GG_WHEN_UNAVAILABLE, "fail")) {
                say("%s: not run: no lsfproxyd answered (%s) (when_unavailable: fail)", GG_NAME,
                    listed);
                return EXIT_UNAVAILABLE;
            }
            say("warning: no lsfproxyd answered (%s): proceeding without a token", listed);
            return run("", category);
        }
        if (!strcmp(result, "granted") && answered >= 0) {
            size_t n = strlen(r.token);
            if (holder_pipe >= 0 && write(holder_pipe, r.token, n) == (ssize_t)n)
                close(l.fd); /* the holder's copy keeps the connection, and the token */
            else
                fcntl(l.fd, F_SETFD, 0); /* no holder: the command holds the connection */
            if (holder_pipe >= 0)
                close(holder_pipe); /* the holder reads the token, then end of file */
            holder_pipe = -1;
            if (r.has_nice && r.nice > 0 && r.nice < 20) {
                lower(0, r.nice);
                if (GG_NICE_CALLER && geteuid() != 0 && getppid() > 1)
                    lower(getppid(), r.nice); /* gating.lower_caller: next calls niced */
            }
            return run(r.token, category);
        }
        if (answered >= 0)
            close(l.fd);
        holder_abandon();
        if (!strcmp(result, "proceed"))
            return run("", category);
        if (!strcmp(reason, "blocked"))
            return fallback(argv); /* its wording is gridgate's own (wire.blocked_message) */
        tries++;
        if (GG_NOTOKEN_NTRIES >= 0 && tries >= GG_NOTOKEN_NTRIES) {
            say("%s: no %s token, not run: no token after %d attempt(s), last: %s from %s",
                GG_NAME, category, tries, reason, by);
            return EXIT_NO_TOKEN;
        }
        int e = tries - 1 < 16 ? tries - 1 : 16;
        double delay = 0.1 * (double)(1 << e);
        if (delay > 5.0)
            delay = 5.0;
        delay *= 0.5 + rand01() / 2;
        struct timespec ts = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        notice = -1; /* said once is enough */
    }
}
