// The kernel side of audit.process_spawns (services/sandbox-runner/runtimes/local/process-tracer.ts):
// every exec and exit of a task in a watched pid namespace, as one record each in one ring buffer.
// Built on first use with clang (-target bpf); the loader (tracer.c) attaches it and prints the records.
//
// No vmlinux.h: the few kernel fields read are declared here and relocated against the running
// kernel's BTF (CO-RE) when the loader loads the object.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "tracer.h"

struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));

struct pid_namespace {
	struct ns_common ns;
} __attribute__((preserve_access_index));

struct nsproxy {
	struct pid_namespace *pid_ns_for_children;
} __attribute__((preserve_access_index));

struct mm_struct {
	unsigned long arg_start;
	unsigned long arg_end;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	int exit_code;
	struct task_struct *real_parent;
	struct mm_struct *mm;
	struct nsproxy *nsproxy;
} __attribute__((preserve_access_index));

char LICENSE[] SEC("license") = "GPL";

/** The watched pid namespaces (inode numbers), filled by the loader from its stdin. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TRACER_MAX_WATCHED);
	__type(key, __u64);
	__type(value, __u8);
} watched SEC(".maps");

/** One ring for every CPU: records come out in the order they were written, across CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, TRACER_RING_BYTES);
} events SEC(".maps");

/** Where an exec record is put together (too big for the BPF stack). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tracer_exec);
} scratch SEC(".maps");

/** Records that did not fit in the ring, per CPU: the loader reports their sum when it grows. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

static __always_inline __u64 namespace_of(struct task_struct *task) {
	return task->nsproxy->pid_ns_for_children->ns.inum;
}

/**
 * The loader reads the ring every TRACER_POLL_MS and is not woken for each record (a wakeup per
 * exec costs more than the record); only when the ring is a quarter full is it woken at once.
 */
static __always_inline __u64 wakeup(void) {
	return bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > TRACER_RING_BYTES / 4 ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

static __always_inline void count_lost(void) {
	__u32 zero = 0;
	__u64 *count = bpf_map_lookup_elem(&lost, &zero);
	if (count) *count += 1;
}

/**
 * After the exec has replaced the program, before it runs: the new image's argument area is
 * read here, so what is recorded is what runs.
 */
SEC("tp_btf/sched_process_exec")
int on_exec(__u64 *ctx) {
	struct task_struct *task = (struct task_struct *)ctx[0];
	__u64 namespace = namespace_of(task);
	if (!bpf_map_lookup_elem(&watched, &namespace)) return 0;
	__u32 zero = 0;
	struct tracer_exec *record = bpf_map_lookup_elem(&scratch, &zero);
	if (!record) return 0;
	record->kind = TRACER_EXEC;
	record->pid = task->tgid;
	record->parent = task->real_parent->tgid;
	record->grandparent = task->real_parent->real_parent->tgid;
	record->namespace = namespace;
	record->ns = bpf_ktime_get_ns();
	unsigned long start = task->mm->arg_start;
	unsigned long end = task->mm->arg_end;
	__u64 length = end > start ? end - start : 0;
	record->length = length;
	__u32 size = length > TRACER_ARGV_BYTES ? TRACER_ARGV_BYTES : length;
	// The mask is a no-op (size <= TRACER_ARGV_BYTES < TRACER_ARGV_AREA) that shows the verifier the bound.
	size &= TRACER_ARGV_AREA - 1;
	if (bpf_probe_read_user(record->argv, size, (void *)start) != 0) size = 0;
	record->size = size;
	if (bpf_ringbuf_output(&events, record, sizeof(*record) - TRACER_ARGV_AREA + size, wakeup()) != 0) count_lost();
	return 0;
}

/** A process (its thread group leader) ends: its exit status. */
SEC("tp_btf/sched_process_exit")
int on_exit(__u64 *ctx) {
	struct task_struct *task = (struct task_struct *)ctx[0];
	if (task->pid != task->tgid) return 0;
	__u64 namespace = namespace_of(task);
	if (!bpf_map_lookup_elem(&watched, &namespace)) return 0;
	struct tracer_exit record = { .kind = TRACER_EXIT, .pid = task->tgid, .status = task->exit_code, .ns = bpf_ktime_get_ns() };
	if (bpf_ringbuf_output(&events, &record, sizeof(record), wakeup()) != 0) count_lost();
	return 0;
}
