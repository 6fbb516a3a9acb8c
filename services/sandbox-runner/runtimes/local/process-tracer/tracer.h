// The records the BPF program (tracer.bpf.c) writes to its ring and the loader (tracer.c) reads.
#ifndef TRACER_H
#define TRACER_H

/** The most of a command line recorded (process-tracer.ts's ARGV_BYTES); the rest is cut. */
#define TRACER_ARGV_BYTES 3200
/** The argv buffer of a record: a power of two above TRACER_ARGV_BYTES. */
#define TRACER_ARGV_AREA 4096
#define TRACER_RING_BYTES (8 << 20)
#define TRACER_MAX_WATCHED 4096
/** How often the loader reads the ring (the program wakes it sooner only when the ring fills). */
#define TRACER_POLL_MS 20

enum { TRACER_EXEC = 1, TRACER_EXIT = 2 };

struct tracer_exit {
	__u32 kind;
	__u32 pid;
	__s32 status;
	__u32 pad;
	__u64 ns;
};

struct tracer_exec {
	__u32 kind;
	__u32 pid;
	__u32 parent;
	__u32 grandparent;
	__u64 namespace;
	__u64 ns;
	/** the argument area's full length, and how much of it was read into argv */
	__u64 length;
	__u32 size;
	__u32 pad;
	__u8 argv[TRACER_ARGV_AREA];
};

#endif
