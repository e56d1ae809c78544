/* The kernel's share of a sandbox, without Python: per iteration, a fork (of this small
 * process) into a new PID namespace; the child enters a lent network namespace and new mount,
 * IPC and UTS namespaces, mounts a tmpfs with two directories bound from it and a /proc, sets
 * its hostname and exits; the parent reaps it. With "0" as argv[2] the same loop with no
 * namespace and no mount (the difference is the isolation's own kernel cost).
 * Prints: CPU microseconds per iteration of parent and child. Needs root. Built and run by
 * bench_sandbox.py when a C compiler is there. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static double cpu(int who) {
    struct rusage r;
    getrusage(who, &r);
    return r.ru_utime.tv_sec + r.ru_stime.tv_sec + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
}

static void child(int net, const char *dir) {
    char path[4096];
    if (setns(net, CLONE_NEWNET) || unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS)) _exit(2);
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) _exit(3);
    if (mount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=0755")) _exit(4);
    snprintf(path, sizeof path, "%s/work", dir);
    mkdir(path, 0700);
    if (mount(path, dir, NULL, MS_BIND, NULL)) _exit(5);
    snprintf(path, sizeof path, "%s/tmp", dir);
    mkdir(path, 01777);
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL)) _exit(6);
    if (sethostname("sandbox", 7)) _exit(7);
    _exit(0);
}

int main(int argc, char **argv) {
    if (argc < 4) return 1;
    int n = atoi(argv[1]), isolate = atoi(argv[2]);
    const char *dir = argv[3];
    int net = -1, home_pid = open("/proc/self/ns/pid", O_RDONLY);
    if (isolate) {
        int home_net = open("/proc/self/ns/net", O_RDONLY);
        if (unshare(CLONE_NEWNET)) { perror("unshare(CLONE_NEWNET)"); return 1; }
        net = open("/proc/self/ns/net", O_RDONLY);
        if (setns(home_net, CLONE_NEWNET)) return 1;
    }
    double p0 = cpu(RUSAGE_SELF), c0 = cpu(RUSAGE_CHILDREN);
    for (int i = 0; i < n; i++) {
        if (isolate && unshare(CLONE_NEWPID)) { perror("unshare(CLONE_NEWPID)"); return 1; }
        pid_t pid = fork();
        if (pid == 0) {
            if (isolate) child(net, dir);
            _exit(0);
        }
        if (isolate && setns(home_pid, CLONE_NEWPID)) return 1;
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
            fprintf(stderr, "child failed: %d\n", WEXITSTATUS(st));
            return 1;
        }
    }
    printf("%.2f %.2f\n", (cpu(RUSAGE_SELF) - p0) / n * 1e6, (cpu(RUSAGE_CHILDREN) - c0) / n * 1e6);
    return 0;
}
