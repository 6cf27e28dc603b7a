/* A slow disk for one node, as an LD_PRELOAD layer (this machine's kernel has no
 * device-mapper, so no dm-delay): fsync and fdatasync first sleep for the number of
 * milliseconds the file named by RAFTBOX_FSYNC_DELAY_FILE holds (nothing, 0, or a missing
 * file: no delay), then do their work. The harness (cluster-tests/src/cluster.rs,
 * `ClusterOptions::slow_disks`) compiles it with `cc -shared -fPIC` into the cluster
 * directory and changes the file to slow a node's disk down and back.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long delay_ms(void) {
    const char *path = getenv("RAFTBOX_FSYNC_DELAY_FILE");
    if (path == NULL) {
        return 0;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    char text[32] = {0};
    ssize_t n = read(fd, text, sizeof(text) - 1);
    close(fd);
    return n > 0 ? strtol(text, NULL, 10) : 0;
}

static void stall(void) {
    long ms = delay_ms();
    if (ms > 0) {
        struct timespec pause = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&pause, &pause) != 0) {
        }
    }
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL) {
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    }
    stall();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL) {
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    }
    stall();
    return real(fd);
}
