// libuv's thread pool runs this process's file system calls (the log's writes and fsync among
// them) and every call into the embedded ClickHouse (chDB's async API holds a pool thread for a
// whole query). With libuv's default of 4 threads, four long analyst queries left none for the
// file system: a stat waited 27 s behind them, and with it every append to the log. libuv sizes
// its pool once, when it is first used, which is before any ES module runs; so the size is set
// here, in a CommonJS preload (`node --require`), and child processes inherit it from the
// environment. An explicit UV_THREADPOOL_SIZE is kept. The store never lets the engine hold more
// than the pool minus two threads (services/kernel/store/chdb-store.ts).
if (!process.env.UV_THREADPOOL_SIZE) process.env.UV_THREADPOOL_SIZE = '16';
