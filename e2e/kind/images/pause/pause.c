/*
 * pause: the process of a pod's sandbox container. It only has to exist, so
 * the pod's namespaces outlive restarts of its other containers. When the pod
 * shares one PID namespace it is PID 1 there, so it also reaps the zombies
 * that orphaned processes leave behind. SIGINT or SIGTERM stops it (exit 0).
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

static void on(int sig, void (*handler)(int), int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, NULL) != 0) {
        perror("pause: sigaction");
        _exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
        puts("pause (frota e2e/kind) 1.0");
        return 0;
    }
    if (getpid() != 1) {
        fputs("pause: not PID 1; zombies of this namespace are not mine to reap\n", stderr);
    }
    on(SIGINT, stop, 0);
    on(SIGTERM, stop, 0);
    on(SIGCHLD, reap, SA_NOCLDSTOP | SA_RESTART);
    for (;;) {
        pause();
    }
}
