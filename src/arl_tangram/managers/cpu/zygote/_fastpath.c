/* The sandbox's set-up path in C: what runs between the fork and the action's code.
 *
 * Each function does, in one call and touching as few Python objects as it can, what the
 * Python functions it replaces do call by call (same system calls, same order, same errors as
 * OSError):
 *   fork_all     zygote._fork_all's loop of forks; each child then runs init_setup and, for a
 *                direct sandbox that does not warm, direct_take (sandbox.serve's first step)
 *   init_setup   zygote._init + sandbox.become   (a new sandbox init, right after its fork)
 *   detach       child.detach, fds and session part (signals stay in Python)
 *   direct_fds   sandbox._run_direct's fd juggling + detach; returns (status fd, its inode)
 *   drop         the OOM score and cwd of detach, then child.pre_drop + child.final_drop
 *                (rlimits, no groups, gid, cgroup namespace, uid, no_new_privs, seccomp filter)
 *   direct_take  the next request; a compact direct one (wire.encode_direct) is taken through
 *                sandbox._run_direct's steps (file, stdin, fds, drop), then its code is run as
 *                child.exec_job + child.exec_python run a Python job (`run_python`: through
 *                the C API, none of our Python code between the fork and the action's); it
 *                never comes back. Needs `configure` (the fork server, once).
 * Why: a fresh fork of the fork server copies every page it writes (copy-on-write); Python
 * code writes reference counts, frames and caches all over the interpreter's memory, so the
 * same calls made from Python cost ~150 more page faults per sandbox, and the Python between
 * the fork and the code another ~60 (docs/sandbox.md).
 * The Python versions stay, and run where this extension is not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <unistd.h>
#include <grp.h>

#ifndef CLONE_NEWCGROUP
#define CLONE_NEWCGROUP 0x02000000
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif

/* errno-carrying OSError, like the Python wrappers raise (OSError(errno, message)) */
static PyObject *oserror(const char *what) {
    int e = errno;
    char msg[256];
    snprintf(msg, sizeof msg, "%s: %s", what, strerror(e));
    PyObject *args = Py_BuildValue("(is)", e, msg);
    if (args != NULL) {
        PyErr_SetObject(PyExc_OSError, args);
        Py_DECREF(args);
    }
    return NULL;
}

static int close_from(int lo) {
    if (syscall(SYS_close_range, (unsigned)lo, ~0U, 0) == 0)
        return 0;
    for (int fd = lo; fd < (1 << 16); fd++)  /* (kernels before 5.9) */
        close(fd);
    return 0;
}

static int write_small(const char *path, const char *data) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, data, strlen(data));
    close(fd);
    return n < 0 ? -1 : 0;
}

/* init_setup(cg, sock, net, out_w, err_w, workdir_mb, uid, gid, hostname, sandbox_dir,
 *            workdir); cg: the fds of the cgroup slot's `tasks` files, written first */
static PyObject *init_setup(PyObject *self, PyObject *args) {
    PyObject *cg;
    int sock, net, out_w, err_w, mb, uid, gid;
    const char *host, *sbdir, *workdir;
    Py_ssize_t hostlen;
    if (!PyArg_ParseTuple(args, "O!iiiiiiiy#yy", &PyTuple_Type, &cg, &sock, &net, &out_w,
                          &err_w, &mb, &uid, &gid, &host, &hostlen, &sbdir, &workdir))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(cg); i++) {  /* (see zygote._init) */
        int fd = (int)PyLong_AsLong(PyTuple_GET_ITEM(cg, i));
        if ((fd < 0 && PyErr_Occurred()) || write(fd, "0", 1) != 1)
            return PyErr_Occurred() ? NULL : oserror("joining the cgroup slot");
    }
    char buf[512];
    sigset_t none;
    struct sigaction act;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        return oserror("prctl(PR_SET_PDEATHSIG)");
    sigemptyset(&none);
    if (sigprocmask(SIG_SETMASK, &none, NULL) != 0)
        return oserror("sigprocmask");
    memset(&act, 0, sizeof act);
    act.sa_handler = SIG_DFL;
    if (sigaction(SIGCHLD, &act, NULL) != 0)
        return oserror("sigaction(SIGCHLD)");
    act.sa_handler = SIG_IGN;  /* (as Python's own table has it since the interpreter's start) */
    if (sigaction(SIGPIPE, &act, NULL) != 0)
        return oserror("sigaction(SIGPIPE)");
    if (setns(net, CLONE_NEWNET) != 0)
        return oserror("setns(CLONE_NEWNET)");
    if (unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS) != 0)
        return oserror("unshare(CLONE_NEWNS|CLONE_NEWIPC|CLONE_NEWUTS)");
    if (dup2(sock, 3) < 0)
        return oserror("dup2(control socket)");
    if (out_w >= 0) {  /* direct: the write ends of stdout/stderr at 4 and 5 (moved up first) */
        int a = fcntl(out_w, F_DUPFD, 300), b = fcntl(err_w, F_DUPFD, 300);
        if (a < 0 || b < 0 || dup2(a, 4) < 0 || dup2(b, 5) < 0)
            return oserror("moving the output pipes");
    }
    close_from(out_w >= 0 ? 6 : 4);  /* the control socket, namespace fds */
    /* sandbox.become: the per-sandbox mounts in the fresh mount namespace */
    /* (INODES_PER_MB = 256, as sandbox.init has it) */
    snprintf(buf, sizeof buf, "size=%dm,nr_inodes=%d,mode=0755", mb, mb * 256);
    if (mount("tmpfs", sbdir, "tmpfs", MS_NOSUID | MS_NODEV, buf) != 0)
        return oserror("mount(tmpfs, sandbox dir)");
    static const char *names[2] = {"work", "tmp"};
    static const mode_t modes[2] = {0700, 01777};
    char paths[2][256];
    for (int i = 0; i < 2; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/%s", sbdir, names[i]);
        if (mkdir(paths[i], 0777) != 0 || chown(paths[i], uid, gid) != 0
            || chmod(paths[i], modes[i]) != 0)
            return oserror(paths[i]);
    }
    if (mount(paths[0], workdir, NULL, MS_BIND, NULL) != 0)
        return oserror("mount(workdir)");
    if (mount(paths[1], "/tmp", NULL, MS_BIND, NULL) != 0)
        return oserror("mount(/tmp)");
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
        return oserror("mount(proc)");
    if (sethostname(host, (size_t)hostlen) != 0)
        return oserror("sethostname");
    /* (needs CAP_SYS_RESOURCE; children get 1000 anyway, so the OOM killer picks them) */
    write_small("/proc/self/oom_score_adj", "-1000");
    Py_RETURN_NONE;
}

/* detach(fd0, fd1, fd2, keep): own session, fds 0-2 from the arguments, fds 3..3+keep kept */
static PyObject *detach(PyObject *self, PyObject *args) {
    int fds[3], keep;
    if (!PyArg_ParseTuple(args, "iiii", &fds[0], &fds[1], &fds[2], &keep))
        return NULL;
    if (setsid() < 0)
        return oserror("setsid");
    for (int i = 0; i < 3; i++)
        if (fds[i] != i && dup2(fds[i], i) < 0)
            return oserror("dup2");
    close_from(3 + keep);
    Py_RETURN_NONE;
}

/* The direct path's fds: stdin from fd_in, stdout/stderr the pipes at 4/5, the control socket
 * (fd 3) moved out of the code's way, close-on-exec; own session; every other fd closed.
 * Sets *status and *ino; on failure returns what failed (errno set), else NULL. */
static const char *direct_fds_c(int fd_in, int *status, unsigned long long *ino) {
    int ctl = fcntl(3, F_DUPFD, 300), a = fcntl(fd_in, F_DUPFD, 300);
    int b = fcntl(4, F_DUPFD, 300), c = fcntl(5, F_DUPFD, 300);
    if (ctl < 0 || a < 0 || b < 0 || c < 0 || dup2(ctl, 3) < 0)
        return "moving fds";
    if (setsid() < 0)
        return "setsid";
    if (dup2(a, 0) < 0 || dup2(b, 1) < 0 || dup2(c, 2) < 0)
        return "dup2";
    close_from(4);
    *status = fcntl(3, F_DUPFD_CLOEXEC, 900);
    if (*status < 0)
        return "fcntl(F_DUPFD_CLOEXEC)";
    close(3);
    struct stat st;
    if (fstat(*status, &st) != 0)
        return "fstat";
    *ino = (unsigned long long)st.st_ino;
    return NULL;
}

/* direct_fds(fd_in) -> (status fd, its inode): `direct_fds_c` */
static PyObject *direct_fds(PyObject *self, PyObject *args) {
    int fd_in, status;
    unsigned long long ino;
    if (!PyArg_ParseTuple(args, "i", &fd_in))
        return NULL;
    const char *what = direct_fds_c(fd_in, &status, &ino);
    if (what != NULL)
        return oserror(what);
    return Py_BuildValue("(iK)", status, ino);
}

/* drop(workdir, oom_adj, fsize, nofile, gid, cpu_s, uid, filter): the OOM score (best effort),
 * cwd, then pre_drop and final_drop: no core, file size, open files, no groups, the gid,
 * parent-death signal, CPU seconds, a cgroup namespace, the uid, parent-death signal again,
 * no_new_privs, and last the seccomp program (raw BPF; None: no filter). */
static const char *drop_c(const char *workdir, const char *oom, long long fsize,
                          long long nofile, int gid, long long cpu_s, int uid, const char *bpf,
                          Py_ssize_t bpflen) {
    write_small("/proc/self/oom_score_adj", oom);
    if (chdir(workdir) != 0)
        return "chdir(workdir)";
    struct rlimit r = {0, 0};
    if (setrlimit(RLIMIT_CORE, &r) != 0)
        return "setrlimit(RLIMIT_CORE)";
    r.rlim_cur = r.rlim_max = (rlim_t)fsize;
    if (setrlimit(RLIMIT_FSIZE, &r) != 0)
        return "setrlimit(RLIMIT_FSIZE)";
    r.rlim_cur = r.rlim_max = (rlim_t)nofile;
    if (setrlimit(RLIMIT_NOFILE, &r) != 0)
        return "setrlimit(RLIMIT_NOFILE)";
    if (setgroups(0, NULL) != 0)
        return "setgroups";
    if (setresgid(gid, gid, gid) != 0)
        return "setresgid";
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        return "prctl(PR_SET_PDEATHSIG)";
    r.rlim_cur = (rlim_t)cpu_s;
    r.rlim_max = (rlim_t)cpu_s + 1;
    if (setrlimit(RLIMIT_CPU, &r) != 0)
        return "setrlimit(RLIMIT_CPU)";
    if (unshare(CLONE_NEWCGROUP) != 0)
        return "unshare(CLONE_NEWCGROUP)";
    if (setresuid(uid, uid, uid) != 0)
        return "setresuid";
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        return "prctl(PR_SET_PDEATHSIG)";
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return "prctl(PR_SET_NO_NEW_PRIVS)";
    if (bpf != NULL) {
        struct sock_fprog prog = {(unsigned short)(bpflen / 8), (struct sock_filter *)bpf};
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0)
            return "prctl(PR_SET_SECCOMP)";
    }
    return NULL;
}

static PyObject *drop(PyObject *self, PyObject *args) {
    const char *workdir, *oom, *bpf = NULL;
    long long fsize, nofile, cpu_s;
    int uid, gid;
    Py_ssize_t bpflen = 0;
    if (!PyArg_ParseTuple(args, "yyLLiLiz#", &workdir, &oom, &fsize, &nofile, &gid, &cpu_s,
                          &uid, &bpf, &bpflen))
        return NULL;
    const char *what = drop_c(workdir, oom, fsize, nofile, gid, cpu_s, uid, bpf, bpflen);
    if (what != NULL)
        return oserror(what);
    Py_RETURN_NONE;
}

static int read_all(int fd, char *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r == 0 ? 1 : -1;  /* 1: end of file */
        got += (size_t)r;
    }
    return 0;
}

static int write_all(int fd, const char *buf, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

static void cannot_start(const char *what) {  /* like `_run_direct`: report, exit 127 */
    char msg[320];
    int n = snprintf(msg, sizeof msg, "sandbox: cannot start: %s: %s\n", what, strerror(errno));
    if (n > 0)
        write_all(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    _exit(127);
}

/* What `direct_take` and `run_python` need, set once by the fork server (`configure`): the
 * signal module's own `signal` function and the signals whose disposition a job's process
 * resets (`child.default_signals`), `child.code_failed` (exit code and printing of code that
 * raised), the work directory with its slash ("/workdir/"), the syscall filter (raw BPF, or
 * None: none), the directory of the sandbox's tmpfs (`sandbox.init.SANDBOX_DIR`, remounted
 * smaller for a small memory limit). Forks inherit them; reading them writes nothing. */
static PyObject *signal_fn, *default_signals, *code_failed, *workdir_slash, *filter, *sandbox_dir;

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *fn, *sigs, *failed, *wd, *bpf, *sbdir;
    if (!PyArg_ParseTuple(args, "OO!OO!OO!", &fn, &PyTuple_Type, &sigs, &failed, &PyBytes_Type,
                          &wd, &bpf, &PyBytes_Type, &sbdir))
        return NULL;
    if (bpf != Py_None && !PyBytes_Check(bpf))
        return PyErr_Format(PyExc_TypeError, "configure: the filter is bytes or None");
    Py_XSETREF(signal_fn, Py_NewRef(fn));
    Py_XSETREF(default_signals, Py_NewRef(sigs));
    Py_XSETREF(code_failed, Py_NewRef(failed));
    Py_XSETREF(workdir_slash, Py_NewRef(wd));
    Py_XSETREF(filter, Py_NewRef(bpf));
    Py_XSETREF(sandbox_dir, Py_NewRef(sbdir));
    Py_RETURN_NONE;
}

static PyObject *cpu_count_fn(PyObject *n, PyObject *unused) { return Py_NewRef(n); }
static PyMethodDef cpu_count_def = {"cpu_count", cpu_count_fn, METH_NOARGS,
                                    "the CPUs allotted to this action"};

/* The exit code of the failure now raised (cleared), from `child.code_failed(exc, tb)`, which
 * prints it as the interpreter would; the traceback is the code's own (no frame of ours). */
static int failed_rc(void) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *r = PyObject_CallFunctionObjArgs(code_failed, value ? value : Py_None,
                                               tb ? tb : Py_None, NULL);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    long rc = r != NULL && PyLong_Check(r) ? PyLong_AsLong(r) : 1;
    Py_XDECREF(r);
    PyErr_Clear();
    return (int)rc;
}

/* Call sys.modules[mod].name() if that module is loaded; -1 (error cleared) if the call failed,
 * else 0, with the result's truth in *truth when truth is not NULL. */
static int call_loaded(const char *mod, const char *name, int *truth) {
    PyObject *m = PyDict_GetItemString(PyImport_GetModuleDict(), mod);  /* (borrowed) */
    if (truth != NULL)
        *truth = 0;
    if (m == NULL)
        return 0;
    PyObject *r = PyObject_CallMethod(m, name, NULL);
    if (r == NULL) {
        PyErr_Clear();
        return -1;
    }
    if (truth != NULL)
        *truth = PyObject_IsTrue(r) > 0;
    Py_DECREF(r);
    return 0;
}

/* run_python: a compact direct action's code, in this process (set up and unprivileged by now),
 * as child.default_signals + child.exec_job + child.exec_python do it for that job on the
 * Python path (sandbox._run_direct; same steps, same order: a change there must be made here
 * too): the signals' dispositions through
 * Python's own table, os.cpu_count, sys.path[0], sys.argv, the globals, compile + exec, then
 * threading's and atexit's shutdown, both streams flushed, the exit code reported on the status
 * socket (if it is still ours), exit. Never returns. Without the interpreter's frames for all
 * that, a fresh fork writes (copy-on-write faults) far fewer pages. */
static void run_python(PyObject *code, PyObject *filename, int status, unsigned long long ino,
                       double cpus) {
    int rc = 127;
    const char *what = "signals";
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(default_signals); i++) {
        PyObject *r = PyObject_CallFunction(signal_fn, "Oi",
                                            PyTuple_GET_ITEM(default_signals, i), 0);
        if (r == NULL)
            goto broken;
        Py_DECREF(r);
    }
    what = "job";
    long n = (long)(cpus + 0.999);
    PyObject *modules = PyImport_GetModuleDict();
    PyObject *os_mod = PyDict_GetItemString(modules, "os");  /* (borrowed) */
    PyObject *ncpu = PyLong_FromLong(n < 1 ? 1 : n);
    PyObject *count = ncpu ? PyCFunction_New(&cpu_count_def, ncpu) : NULL;
    Py_XDECREF(ncpu);
    int bad = os_mod == NULL || count == NULL
              || PyObject_SetAttrString(os_mod, "cpu_count", count) != 0;
    Py_XDECREF(count);
    if (bad)
        goto broken;
    PyObject *path = PySys_GetObject("path");  /* (borrowed) */
    PyObject *first = Py_BuildValue("[s]", "/workdir");  /* sys.path[0:1] = [workdir] */
    bad = path == NULL || !PyList_Check(path) || first == NULL
          || PyList_SetSlice(path, 0, 1, first) != 0;
    Py_XDECREF(first);
    PyObject *argv = bad ? NULL : Py_BuildValue("[O]", filename);  /* sys.argv = [filename] */
    bad = argv == NULL || PySys_SetObject("argv", argv) != 0;
    Py_XDECREF(argv);
    PyObject *builtins = PyDict_GetItemString(modules, "builtins");
    PyObject *glb = bad || builtins == NULL ? NULL
                    : Py_BuildValue("{sssOsO}", "__name__", "__main__", "__builtins__",
                                    builtins, "__file__", filename);
    if (glb == NULL)
        goto broken;
    /* compile(code, filename, "exec", dont_inherit=True), then exec(it, glb) */
    PyObject *compile = PyDict_GetItemString(PyModule_GetDict(builtins), "compile");
    PyObject *co = compile ? PyObject_CallFunction(compile, "OOsii", code, filename, "exec", 0, 1)
                           : NULL;
    PyObject *res = co ? PyEval_EvalCode(co, glb, glb) : NULL;
    Py_XDECREF(co);
    if (res != NULL) {
        rc = 0;
        Py_DECREF(res);
    } else {
        rc = failed_rc();
    }
    Py_DECREF(glb);
    /* what interpreter shutdown does, only where the code set it up (see child.exec_job) */
    int more = 0;
    if (call_loaded("threading", "_shutdown", NULL) == 0
        && call_loaded("atexit", "_ncallbacks", &more) == 0 && more)
        call_loaded("atexit", "_run_exitfuncs", NULL);
    static const char *streams[2] = {"stdout", "stderr"};
    for (int i = 0; i < 2; i++) {
        PyObject *s = PySys_GetObject(streams[i]);
        PyObject *r = s ? PyObject_CallMethod(s, "flush", NULL) : NULL;
        if (r == NULL) {
            PyErr_Clear();
            rc = rc ? rc : 120;
        }
        Py_XDECREF(r);
    }
    struct stat st;  /* the exit code on the status socket, framed for the manager */
    if (fstat(status, &st) == 0 && (unsigned long long)st.st_ino == ino) {
        char frame[32];
        int len = snprintf(frame + 4, sizeof frame - 4, "{\"rc\":%d}", rc & 0xFF);
        frame[0] = frame[1] = 0;
        frame[2] = (char)(len >> 8);
        frame[3] = (char)len;
        write_all(status, frame, (size_t)len + 4);
    }
    _exit(rc);
broken:  /* (our own step failed, not the code: like child.exec_job, report and exit) */
    PyErr_Clear();
    char msg[128];
    int m = snprintf(msg, sizeof msg, "sandbox: cannot start: %s\n", what);
    if (m > 0)
        write_all(2, msg, (size_t)m);
    _exit(rc);
}

#define DIRECT_MAGIC "\0TGD"
#define MAX_FRAME (256u << 20)
struct direct_head {  /* after the magic; little-endian, packed as wire.DIRECT (struct "<") */
    long long uid, gid, cpu_s, fsize, nofile;
    double cpus;
    unsigned int tmpfs_mb, name_len, code_len, stdin_len;
} __attribute__((packed));

/* direct_take(fd) -> bytes. Reads the next request frame from the
 * manager (fd 3). A marshal request comes back as its bytes. A compact direct request
 * (wire.encode_direct: the common Python action, no files, the sandbox's own environment) is
 * run here, as sandbox._run_direct does it: main file written as root (owned by the sandbox
 * uid), stdin from a memfd, fds, own session, then the privilege drop and the syscall filter,
 * then the code (`run_python`); it never returns. A failure after the frame is read reports on
 * fd 2 and exits 127, like the Python path. Needs `configure` first (the fork server's). */
static PyObject *direct_take(PyObject *self, PyObject *arg) {
    int fd = (int)PyLong_AsLong(arg);
    if (fd < 0 && PyErr_Occurred())
        return NULL;
    if (code_failed == NULL)
        return PyErr_Format(PyExc_RuntimeError, "direct_take: not configured");
    const char *wds = PyBytes_AS_STRING(workdir_slash);
    const char *bpf = filter != Py_None ? PyBytes_AS_STRING(filter) : NULL;
    Py_ssize_t bpflen = filter != Py_None ? PyBytes_GET_SIZE(filter) : 0;
    unsigned char hdr[4];
    int r = read_all(fd, (char *)hdr, 4);
    if (r != 0)
        return r > 0 ? PyErr_Format(PyExc_EOFError, "peer closed") : oserror("read");
    unsigned int n = ((unsigned)hdr[0] << 24) | ((unsigned)hdr[1] << 16) | ((unsigned)hdr[2] << 8)
                     | hdr[3];
    if (n > MAX_FRAME)
        return PyErr_Format(PyExc_ValueError, "frame too large: %u", n);
    PyObject *body = PyBytes_FromStringAndSize(NULL, n);
    if (body == NULL)
        return NULL;
    char *b = PyBytes_AS_STRING(body);
    r = read_all(fd, b, n);
    if (r != 0) {
        Py_DECREF(body);
        return r > 0 ? PyErr_Format(PyExc_EOFError, "peer closed") : oserror("read");
    }
    struct direct_head h;
    if (n < 4 + sizeof h || memcmp(b, DIRECT_MAGIC, 4) != 0)
        return body;  /* a marshal request: Python's */
    memcpy(&h, b + 4, sizeof h);
    const char *name = b + 4 + sizeof h, *code = name + h.name_len, *in = code + h.code_len;
    if ((unsigned long long)4 + sizeof h + h.name_len + h.code_len + h.stdin_len != n
        || h.name_len == 0 || h.name_len > 200 || memchr(name, '/', h.name_len)
        || memchr(name, 0, h.name_len)) {
        Py_DECREF(body);
        return PyErr_Format(PyExc_ValueError, "malformed direct request");
    }
    char path[512];
    if (h.tmpfs_mb > 0) {  /* sandbox._fit_tmpfs: a small memory limit's smaller tmpfs */
        snprintf(path, sizeof path, "size=%um,nr_inodes=%llu", h.tmpfs_mb,
                 (unsigned long long)h.tmpfs_mb * 256);  /* (INODES_PER_MB) */
        if (mount("tmpfs", PyBytes_AS_STRING(sandbox_dir), "tmpfs",
                  MS_REMOUNT | MS_NOSUID | MS_NODEV, path) != 0)
            cannot_start("remounting the tmpfs");
    }
    snprintf(path, sizeof path, "%s%.*s", wds, (int)h.name_len, name);
    PyObject *src = PyUnicode_DecodeUTF8(code, h.code_len, "strict");
    PyObject *fname = PyUnicode_FromString(path);
    if (src == NULL || fname == NULL) {
        Py_XDECREF(src);
        Py_XDECREF(fname);
        Py_DECREF(body);
        return NULL;
    }
    int f = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (f < 0 || write_all(f, code, h.code_len) != 0 || fchown(f, (uid_t)h.uid, (gid_t)h.gid) != 0)
        cannot_start("writing the main file");
    close(f);
    int fd_in;
    if (h.stdin_len > 0) {
        fd_in = (int)syscall(SYS_memfd_create, "stdin", MFD_CLOEXEC);
        if (fd_in < 0 || write_all(fd_in, in, h.stdin_len) != 0 || lseek(fd_in, 0, SEEK_SET) != 0)
            cannot_start("stdin");
    } else {
        fd_in = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd_in < 0)
            cannot_start("/dev/null");
    }
    double cpus = h.cpus;
    int status;
    unsigned long long ino;
    const char *what = direct_fds_c(fd_in, &status, &ino);
    if (what == NULL) {
        /* (workdir without its slash: "/workdir/" -> "/workdir") */
        char wd[256];
        snprintf(wd, sizeof wd, "%s", wds);
        size_t l = strlen(wd);
        if (l > 1 && wd[l - 1] == '/')
            wd[l - 1] = 0;
        what = drop_c(wd, "1000", h.fsize, h.nofile, (int)h.gid, h.cpu_s, (int)h.uid, bpf, bpflen);
    }
    if (what != NULL)
        cannot_start(what);
    Py_DECREF(body);
    run_python(src, fname, status, ino, cpus);
    return NULL;  /* (not reached) */
}

/* write_each([(path, data), ...]) -> None: open, write, close each in turn, the GIL released
 * once for all (the cgroup placement thread: a move into a v1 cgroup blocks for an RCU grace
 * period, and each release/re-acquire of the GIL by a thread costs the event loop a switch);
 * stops at the first failure and raises it as OSError naming the path. */
static PyObject *write_each(PyObject *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "write_each: a list of (path, data)");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const char **paths = PyMem_Calloc((size_t)n + 1, sizeof *paths);
    const char **datas = PyMem_Calloc((size_t)n + 1, sizeof *datas);
    Py_ssize_t *lens = PyMem_Calloc((size_t)n + 1, sizeof *lens);
    PyObject *ret = NULL;
    if (paths == NULL || datas == NULL || lens == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        Py_ssize_t plen;
        if (!PyArg_ParseTuple(it, "y#y#", &paths[i], &plen, &datas[i], &lens[i]))
            goto done;
    }
    Py_ssize_t bad = -1;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && bad < 0; i++) {
        int fd = open(paths[i], O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, datas[i], (size_t)lens[i]) < 0) {
            err = errno;
            bad = i;
        }
        if (fd >= 0)
            close(fd);
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyObject *args = Py_BuildValue("(isy)", err, strerror(err), paths[bad]);
        if (args != NULL) {
            PyErr_SetObject(PyExc_OSError, args);
            Py_DECREF(args);
        }
        goto done;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    PyMem_Free(paths);
    PyMem_Free(datas);
    PyMem_Free(lens);
    Py_DECREF(seq);
    return ret;
}

/* fork_all(n, home_pid, setups, take) -> list | int | bytes: (the fork server) n forks, each
 * the first process of a new PID namespace: unshare(CLONE_NEWPID) for the next child only, fork,
 * then back to our own PID namespace (setns on the fd home_pid), as zygote._fork_all does with
 * os.fork (same hooks: PyOS_BeforeFork / AfterFork_Parent / AfterFork_Child). Every fork
 * write-protects all of this process's memory, so every page written between two forks is a
 * fault: here nothing but this loop's C stack and the import lock is. The i-th child then sets
 * itself up (`init_setup` with the arguments setups[i], made before the forks: the child reads
 * them and writes no Python object for it; a failure is printed and the child exits 1), and
 * with `take` (a direct sandbox that does not warm: what `sandbox.serve` would do first) takes
 * its first request (`direct_take` on fd 3: a compact one runs there and never comes back; the
 * manager gone, the child exits 0). In the parent: a list of n entries, each the child's pid or
 * an OSError; in the i-th child, set up: i, or with `take` the first request's body. */
static PyObject *fork_all(PyObject *self, PyObject *args) {
    int n, home, take;
    PyObject *setups;
    if (!PyArg_ParseTuple(args, "iiO!p", &n, &home, &PyList_Type, &setups, &take))
        return NULL;
    if (n < 0 || n > 4096 || PyList_GET_SIZE(setups) != n)
        return PyErr_Format(PyExc_ValueError, "fork_all: n=%d", n);
    long *got = PyMem_Calloc((size_t)n + 1, sizeof *got);  /* pid, or -errno */
    const char **what = PyMem_Calloc((size_t)n + 1, sizeof *what);
    if (got == NULL || what == NULL) {
        PyMem_Free(got);
        PyMem_Free(what);
        return PyErr_NoMemory();
    }
    for (int i = 0; i < n; i++) {
        if (unshare(CLONE_NEWPID) != 0) {
            got[i] = -errno;
            what[i] = "unshare(CLONE_NEWPID)";
            continue;
        }
        PyOS_BeforeFork();
        pid_t pid = fork();
        int err = errno;
        if (pid == 0) {
            PyOS_AfterFork_Child();
            PyMem_Free(got);
            PyMem_Free(what);
            PyObject *done = init_setup(self, PyList_GET_ITEM(setups, i));
            if (done == NULL) {  /* (like zygote._init: report, exit) */
                PyErr_Print();
                _exit(1);
            }
            Py_DECREF(done);
            if (!take)
                return PyLong_FromLong(i);
            PyObject *first = direct_take(self, PyLong_FromLong(3));  /* (a small int: static) */
            if (first == NULL && (PyErr_ExceptionMatches(PyExc_EOFError)
                                  || PyErr_ExceptionMatches(PyExc_OSError)
                                  || PyErr_ExceptionMatches(PyExc_ValueError)))
                _exit(0);  /* (as sandbox.serve does) */
            return first;
        }
        PyOS_AfterFork_Parent();
        got[i] = pid > 0 ? pid : -err;
        what[i] = "fork";
        if (setns(home, CLONE_NEWPID) != 0 && pid > 0) {  /* (later children: our own again) */
            got[i] = -errno;
            what[i] = "setns(CLONE_NEWPID)";
        }
    }
    PyObject *out = PyList_New(n);
    for (int i = 0; out != NULL && i < n; i++) {
        PyObject *v;
        if (got[i] > 0) {
            v = PyLong_FromLong(got[i]);
        } else {
            char msg[128];
            snprintf(msg, sizeof msg, "%s: %s", what[i], strerror((int)-got[i]));
            v = PyObject_CallFunction(PyExc_OSError, "is", (int)-got[i], msg);
        }
        if (v == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, v);
    }
    PyMem_Free(got);
    PyMem_Free(what);
    return out;
}

static PyMethodDef methods[] = {
    {"fork_all", fork_all, METH_VARARGS, "n forks into new PID namespaces (the fork server)"},
    {"write_each", write_each, METH_O, "open, write, close each (path, data); GIL released once"},
    {"detach", detach, METH_VARARGS, "own session, fds 0-2, close the rest"},
    {"direct_fds", direct_fds, METH_VARARGS, "the direct path's fds; (status fd, inode)"},
    {"drop", drop, METH_VARARGS, "rlimits, gid, cgroup namespace, uid, no_new_privs, filter"},
    {"direct_take", direct_take, METH_O, "next request; a compact direct one is run"},
    {"configure", configure, METH_VARARGS, "what direct_take needs (the fork server, once)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastpath(void) { return PyModule_Create(&module); }
