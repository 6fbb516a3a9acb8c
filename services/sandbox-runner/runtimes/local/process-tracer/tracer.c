// The loader of audit.process_spawns' BPF program (tracer.bpf.c): loads and attaches it, then
// prints its records as lines for services/sandbox-runner/runtimes/local/process-tracer.ts, and takes
// the namespaces to watch from its stdin. Built on first use with gcc, cached by source hash.
//
//   tracer <program.bpf.o> <nonce>
// stdin:  `+ <namespace>` watch a pid namespace, `- <namespace>` stop watching it
// stdout: `<nonce> B <ns>`                     attached; the kernel's monotonic clock now
//         `<nonce> W <namespace> <errno>`      a `+` done (0) or failed
//         `<nonce> e <pid> <parent> <grandparent> <namespace> <ns> <argv length> <argv hex>`
//         `<nonce> q <pid> <exit status> <ns>`
// stderr: `Lost <n> events` when records did not fit in the ring; errors.
// It reads the ring every TRACER_POLL_MS while a namespace is watched (the program wakes it
// sooner only when the ring fills), and sleeps while none is. It ends when its stdin closes (the
// runner is gone) or on SIGTERM; the kernel detaches the program with it.
#include <errno.h>
#include <inttypes.h>
#include <linux/bpf.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "tracer.h"

static const char *nonce;
static char out[1 << 20];
static size_t used;
/** Namespaces in the map: with none, nothing can come and the loader sleeps until told. */
static unsigned watching;

static void flush(void) {
	size_t done = 0;
	while (done < used) {
		ssize_t n = write(STDOUT_FILENO, out + done, used - done);
		if (n < 0) {
			if (errno == EINTR) continue;
			exit(1); // the runner is gone
		}
		done += n;
	}
	used = 0;
}

static void room(size_t n) {
	if (used + n > sizeof(out)) flush();
}

static int on_record(void *ctx, void *data, size_t size) {
	(void)ctx;
	static const char hex[] = "0123456789abcdef";
	__u32 kind = *(__u32 *)data;
	if (kind == TRACER_EXEC && size >= sizeof(struct tracer_exec) - TRACER_ARGV_AREA) {
		const struct tracer_exec *e = data;
		__u32 argv = e->size;
		if (argv > size - (sizeof(*e) - TRACER_ARGV_AREA)) argv = size - (sizeof(*e) - TRACER_ARGV_AREA);
		room(160 + 2 * (size_t)argv);
		used += sprintf(out + used, "%s e %u %u %u %" PRIu64 " %" PRIu64 " %" PRIu64 " ", nonce, e->pid, e->parent, e->grandparent, (uint64_t)e->namespace, (uint64_t)e->ns, (uint64_t)e->length);
		for (__u32 i = 0; i < argv; i++) {
			out[used++] = hex[e->argv[i] >> 4];
			out[used++] = hex[e->argv[i] & 15];
		}
		out[used++] = '\n';
	} else if (kind == TRACER_EXIT && size >= sizeof(struct tracer_exit)) {
		const struct tracer_exit *q = data;
		room(120);
		used += sprintf(out + used, "%s q %u %d %" PRIu64 "\n", nonce, q->pid, q->status, (uint64_t)q->ns);
	}
	return 0;
}

/** `+ <namespace>` / `- <namespace>`: updates the watched map; a `+` is answered. */
static void command(int watched, const char *line) {
	char op;
	unsigned long long namespace;
	if (sscanf(line, "%c %llu", &op, &namespace) != 2) return;
	__u64 key = namespace;
	__u8 one = 1;
	if (op == '+') {
		int err = bpf_map_update_elem(watched, &key, &one, BPF_NOEXIST) ? errno : 0;
		if (err == 0) watching++;
		if (err == EEXIST) err = 0;
		room(80);
		used += sprintf(out + used, "%s W %llu %d\n", nonce, namespace, err);
	} else if (op == '-') {
		if (bpf_map_delete_elem(watched, &key) == 0) watching--;
	}
}

static int print_libbpf(enum libbpf_print_level level, const char *format, va_list args) {
	return level == LIBBPF_DEBUG ? 0 : vfprintf(stderr, format, args);
}

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: %s <program.bpf.o> <nonce>\n", argv[0]);
		return 2;
	}
	nonce = argv[2];
	libbpf_set_print(print_libbpf);
	struct bpf_object *object = bpf_object__open_file(argv[1], NULL);
	if (!object) {
		fprintf(stderr, "cannot open %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	int err = bpf_object__load(object);
	if (err) {
		fprintf(stderr, "cannot load the BPF program: %s\n", strerror(-err));
		return 1;
	}
	struct bpf_program *program;
	bpf_object__for_each_program(program, object) {
		if (!bpf_program__attach(program)) {
			fprintf(stderr, "cannot attach %s: %s\n", bpf_program__name(program), strerror(errno));
			return 1;
		}
	}
	int watched = bpf_object__find_map_fd_by_name(object, "watched");
	int lost = bpf_object__find_map_fd_by_name(object, "lost");
	struct ring_buffer *ring = ring_buffer__new(bpf_object__find_map_fd_by_name(object, "events"), on_record, NULL, NULL);
	if (watched < 0 || lost < 0 || !ring) {
		fprintf(stderr, "the BPF program lacks its maps\n");
		return 1;
	}
	int cpus = libbpf_num_possible_cpus();
	__u64 *counts = calloc(cpus > 0 ? cpus : 1, sizeof(__u64));
	__u64 reported = 0;

	int poll = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = STDIN_FILENO };
	struct epoll_event ringev = { .events = EPOLLIN, .data.fd = -1 };
	if (poll < 0 || epoll_ctl(poll, EPOLL_CTL_ADD, STDIN_FILENO, &ev) || epoll_ctl(poll, EPOLL_CTL_ADD, ring_buffer__epoll_fd(ring), &ringev)) {
		fprintf(stderr, "epoll: %s\n", strerror(errno));
		return 1;
	}
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	used += sprintf(out + used, "%s B %" PRIu64 "\n", nonce, (uint64_t)now.tv_sec * 1000000000u + now.tv_nsec);
	flush();

	char input[4096];
	size_t have = 0;
	for (;;) {
		struct epoll_event ready[2];
		int n = epoll_wait(poll, ready, 2, watching ? TRACER_POLL_MS : -1);
		if (n < 0 && errno != EINTR) {
			fprintf(stderr, "epoll_wait: %s\n", strerror(errno));
			return 1;
		}
		for (int i = 0; i < n; i++) {
			if (ready[i].data.fd != STDIN_FILENO) continue;
			ssize_t got = read(STDIN_FILENO, input + have, sizeof(input) - 1 - have);
			if (got == 0) {
				flush();
				return 0; // the runner closed its end
			}
			if (got < 0) {
				if (errno == EINTR || errno == EAGAIN) continue;
				return 1;
			}
			have += got;
			input[have] = 0;
			char *line = input, *end;
			while ((end = strchr(line, '\n'))) {
				*end = 0;
				command(watched, line);
				line = end + 1;
			}
			have = strlen(line);
			memmove(input, line, have);
			if (have == sizeof(input) - 1) have = 0; // no command is that long
		}
		// Every turn, woken or not (most records are written without a wakeup), and after a `-`:
		// what the namespace wrote before it left the map does not wait in the ring.
		if (ring_buffer__consume(ring) < 0) {
			fprintf(stderr, "cannot read the ring\n");
			return 1;
		}
		__u32 zero = 0;
		if (counts && bpf_map_lookup_elem(lost, &zero, counts) == 0) {
			__u64 total = 0;
			for (int i = 0; i < cpus; i++) total += counts[i];
			if (total > reported) {
				flush(); // what came before the loss first
				fprintf(stderr, "Lost %" PRIu64 " events\n", (uint64_t)(total - reported));
				reported = total;
			}
		}
		if (used) flush();
	}
}
