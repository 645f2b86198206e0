/* An LD_PRELOAD shim for rankd's storage fault tests (built by faultshim.py).
 *
 * RANKD_FAULT_LOG=file         after each successful fsync/fdatasync, append
 *                              "path<TAB>size<TAB>kind" (kind f or d): the size
 *                              the file had before the call, all of it durable
 *                              once the call returned.  A power loss keeps at
 *                              least that much of each file.
 * RANKD_FAULT_FSYNC_DELAY_MS=n every fsync takes n ms longer (a slow disk).
 * RANKD_FAULT_TRIGGER=file     the faults below apply only while this file
 *                              exists, so a test arms them mid-run.
 * RANKD_FAULT_FSYNC_FAIL=s:e   fsync of a path containing s fails with errno e.
 * RANKD_FAULT_WRITE_FAIL=s:e   write to a path containing s fails with errno e.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static ssize_t (*real_write)(int, const void *, size_t);

static const char *setting(const char *name) {
    const char *value = getenv(name);
    return value && *value ? value : NULL;
}

static int path_of(int fd, char *out, size_t size) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, size - 1);
    if (n < 0) {
        out[0] = 0;
        return -1;
    }
    out[n] = 0;
    return 0;
}

/* errno to fail with when `name` is set, armed and matches `path`; else 0. */
static int fault_for(const char *name, const char *path) {
    const char *spec = setting(name);
    const char *trigger = setting("RANKD_FAULT_TRIGGER");
    if (!spec || (trigger && access(trigger, F_OK) != 0)) return 0;
    const char *colon = strrchr(spec, ':');
    if (!colon) return 0;
    char needle[1024];
    size_t length = (size_t)(colon - spec);
    if (length >= sizeof needle) return 0;
    memcpy(needle, spec, length);
    needle[length] = 0;
    return strstr(path, needle) ? atoi(colon + 1) : 0;
}

static void note_durable(const char *path, long long size, int is_dir) {
    const char *log = setting("RANKD_FAULT_LOG");
    if (!log || !path[0]) return;
    char line[4200];
    int n = snprintf(line, sizeof line, "%s\t%lld\t%c\n", path, size, is_dir ? 'd' : 'f');
    int out = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (out < 0) return;
    if (real_write(out, line, (size_t)n) < 0) { /* nothing to do: the test sees a gap */ }
    close(out);
}

static int synced(int fd, int (*real)(int)) {
    if (!real_write) real_write = dlsym(RTLD_NEXT, "write");
    char path[4096];
    path_of(fd, path, sizeof path);
    const char *delay = setting("RANKD_FAULT_FSYNC_DELAY_MS");
    if (delay) {
        long ms = atol(delay);
        struct timespec pause = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&pause, NULL);
    }
    int error = fault_for("RANKD_FAULT_FSYNC_FAIL", path);
    if (error) {
        errno = error;
        return -1;
    }
    struct stat before;
    int known = fstat(fd, &before) == 0;
    int result = real(fd);
    if (result == 0 && known) note_durable(path, (long long)before.st_size, S_ISDIR(before.st_mode));
    return result;
}

int fsync(int fd) {
    if (!real_fsync) real_fsync = dlsym(RTLD_NEXT, "fsync");
    return synced(fd, real_fsync);
}

int fdatasync(int fd) {
    if (!real_fdatasync) real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    return synced(fd, real_fdatasync);
}

ssize_t write(int fd, const void *buffer, size_t count) {
    if (!real_write) real_write = dlsym(RTLD_NEXT, "write");
    if (setting("RANKD_FAULT_WRITE_FAIL")) {
        char path[4096];
        if (path_of(fd, path, sizeof path) == 0) {
            int error = fault_for("RANKD_FAULT_WRITE_FAIL", path);
            if (error) {
                errno = error;
                return -1;
            }
        }
    }
    return real_write(fd, buffer, count);
}
