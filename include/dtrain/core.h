/*
 * dtrain/core.h - status codes, errors, logging, random numbers, threads.
 *
 * Every public dtrain call that can fail returns a dt_status. On failure the
 * library also records a human-readable message for the calling thread,
 * naming what failed and where (file, line, field, rank, op); fetch it with
 * dt_last_error(). The library never calls exit() and never prints errors on
 * its own: the caller decides what to tell the user.
 */
#ifndef DTRAIN_CORE_H
#define DTRAIN_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DT_API __attribute__((visibility("default")))
#define DT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DT_API
#define DT_PRINTF(a, b)
#endif

typedef enum {
    DT_OK = 0,
    DT_ERR_ARG,      /* a caller passed an invalid argument */
    DT_ERR_IO,       /* a file could not be opened, read or written */
    DT_ERR_FORMAT,   /* a file's content is malformed (magic, size, header) */
    DT_ERR_CONFIG,   /* a config field is unknown or has a bad value */
    DT_ERR_NOMEM,    /* an allocation failed */
    DT_ERR_NUMERIC,  /* a NaN or Inf appeared (loss, gradients) */
    DT_ERR_COMM,     /* a communication peer failed or disagreed */
    DT_ERR_TIMEOUT,  /* a wait ran out of time */
    DT_ERR_INTERNAL, /* a bug in dtrain */
} dt_status;

/* Element types of tensors and communication buffers. */
typedef enum { DT_F32 = 0, DT_F16, DT_BF16, DT_I32, DT_I64, DT_U8 } dt_dtype;
DT_API size_t dt_dtype_size(dt_dtype t);
DT_API const char *dt_dtype_name(dt_dtype t); /* safetensors spelling: "F32", ... */
/* n values of type t (DT_F16 or DT_BF16) to fp32 and back; fp32 to 16 bits
 * rounds to nearest even, NaN stays NaN. */
DT_API void dt_to_f32(float *dst, const void *src, size_t n, dt_dtype t);
DT_API void dt_from_f32(void *dst, const float *src, size_t n, dt_dtype t);
/* dst[i] = src[i] rounded to the nearest value of type t (DT_F16 or DT_BF16),
 * kept as fp32 (dst may be src): what dt_from_f32 then dt_to_f32 gives. */
DT_API void dt_round_f32(float *dst, const float *src, size_t n, dt_dtype t);
/* Error feedback's rounding to 16 bits (the fp16/bf16 gradient codecs):
 * g[i] += res[i], dst[i] = g[i] by dt_from_f32, res[i] = g[i] - dst[i]
 * widened (what the 16-bit value lost). The CPU twin of the GPU's ef16. */
DT_API void dt_from_f32_ef(void *dst, float *g, float *res, size_t n, dt_dtype t);

/* The slice [*begin, *end) of n elements that rank `rank` of `world` holds:
 * contiguous, in rank order, sizes differing by at most one. Every sharded
 * range (a strategy's optimizer slice, the gradient norm's part, a
 * checkpoint shard) comes from this one function. */
DT_API void dt_shard_range(size_t n, int rank, int world, size_t *begin, size_t *end);

/* Error paths in one line, as NCCL's NCCLCHECKGOTO: runs call, stores its
 * status in the caller's `st` and jumps to label unless it is DT_OK.
 *   dt_status st = DT_OK;
 *   DT_TRY(dt_optim_create(&opt, &p, n), done);
 *   ...
 *   done: dt_optim_free(opt); return st; */
#define DT_TRY(call, label)                    \
    do {                                       \
        if ((st = (call)) != DT_OK) goto label; \
    } while (0)

/* A short constant name for a status ("io error", ...). */
DT_API const char *dt_status_string(dt_status s);

/* The message recorded by the last failing call on this thread, or "" if
 * none. The pointer stays valid until the next failing call on the thread. */
DT_API const char *dt_last_error(void);

/* Records a message for dt_last_error() and returns s, so that library code
 * can write `return dt_error(DT_ERR_IO, "%s: %s", path, strerror(errno));`.
 * dt_last_error() may be an argument, to add context to an earlier message. */
DT_API dt_status dt_error(dt_status s, const char *fmt, ...) DT_PRINTF(2, 3);

/* Version string "MAJOR.MINOR.PATCH". */
DT_API const char *dt_version(void);
/* The optional parts this build has, e.g. "oneDNN yes, HDF5 yes,
 * libmicrohttpd yes, MPI yes, CUDA yes" (CMakeLists.txt). */
DT_API const char *dt_build_features(void);

/* ---- the CPU ------------------------------------------------------------- */

/* Instruction-set levels, each including the ones below it. */
typedef enum {
    DT_ISA_BASE = 0,     /* x86-64 with SSE4.2 */
    DT_ISA_AVX2,         /* AVX2 and FMA (x86-64-v3): what the build targets */
    DT_ISA_AVX512,       /* AVX-512 F/BW/VL/DQ (x86-64-v4) */
    DT_ISA_AVX512_BF16,  /* AVX-512 with BF16 dot products */
    DT_ISA_AMX,          /* AMX tiles with BF16 */
} dt_isa;

typedef struct {
    char name[64];   /* the brand string, e.g. "AMD EPYC 7B13" */
    char vendor[16]; /* "GenuineIntel", "AuthenticAMD" */
    int family, model;
    dt_isa found;    /* the highest level the CPU and the kernel support */
    dt_isa isa;      /* what dtrain uses: found, or lower when DTRAIN_ISA caps it */
} dt_cpu;

/* The CPU this process runs on, read by cpuid once. The environment
 * variable DTRAIN_ISA=base|avx2|avx512|avx512_bf16|amx caps the level
 * every run-time choice takes (the kernels' and oneDNN's), so the paths of
 * a lower CPU can be tested on a higher one; a cap above the CPU changes
 * nothing. DT_ERR_ARG (message naming the value) for an unknown name; *out
 * is then still the CPU, uncapped. */
DT_API dt_status dt_cpu_detect(const dt_cpu **out);
/* The same, for callers past the start's check (an unknown cap ignored). */
DT_API const dt_cpu *dt_cpu_get(void);
/* "base", "avx2", "avx512", "avx512_bf16", "amx". */
DT_API const char *dt_isa_name(dt_isa isa);

/* ---- logging ------------------------------------------------------------ */

typedef enum { DT_LOG_ERROR = 0, DT_LOG_WARN, DT_LOG_INFO, DT_LOG_DEBUG } dt_log_level;

/* Messages at or below `level` go to stderr (default DT_LOG_INFO, or the
 * DTRAIN_LOG environment variable: error|warn|info|debug), control
 * characters escaped (dt_escape_text). */
DT_API void dt_log_set_level(dt_log_level level);
DT_API dt_log_level dt_log_get_level(void);
DT_API void dt_log(dt_log_level level, const char *fmt, ...) DT_PRINTF(2, 3);

/* ---- random numbers ------------------------------------------------------ */

/* A small, fast, seedable generator (xoshiro256**). Its whole state is this
 * struct, so it can be copied, saved and restored bit-exactly. */
typedef struct { uint64_t s[4]; } dt_rng;

DT_API void dt_rng_seed(dt_rng *r, uint64_t seed);
DT_API uint64_t dt_rng_u64(dt_rng *r);
/* Uniform in [0, n). */
DT_API uint32_t dt_rng_below(dt_rng *r, uint32_t n);
/* Uniform float in [0, 1). */
DT_API float dt_rng_uniform(dt_rng *r);
/* Standard normal (Box-Muller). */
DT_API float dt_rng_normal(dt_rng *r);
/* Fisher-Yates shuffle of idx[0..n). */
DT_API void dt_rng_shuffle(dt_rng *r, uint32_t *idx, size_t n);

/* ---- threads and time ------------------------------------------------------ */

/* Sets the number of compute threads used by dtrain's kernels (OpenMP and
 * the GEMM library). n <= 0 means all available cores. */
DT_API void dt_set_threads(int n);
DT_API int dt_get_threads(void);

/* Monotonic time in seconds. */
DT_API double dt_now(void);

/* The median of v[0..n) (0 when n <= 0); sorts v in place. */
DT_API double dt_median(double *v, int n);

/* 64-byte aligned allocation of n bytes (zeroed); free with dt_free. Returns
 * NULL and records DT_ERR_NOMEM on failure. */
DT_API void *dt_alloc(size_t n);
DT_API void dt_free(void *p);
/* Zeroes p[0, bytes) of private memory (dt_alloc's, malloc's): the whole
 * pages inside a large range are given back to the kernel instead
 * (madvise MADV_DONTNEED: they read as zero and take no memory until
 * touched again), the edges are cleared. */
DT_API void dt_zero_pages(void *p, size_t bytes);
/* Long work inside one call (the streaming pass over a checkpoint, a large
 * model's initialisation) reports that it goes on with dt_alive(),
 * which calls the process's hook (a worker's: a launcher heartbeat, so
 * that such work is not taken for a hang); none installed: nothing. The
 * hook must be quick. */
DT_API void dt_set_alive_hook(void (*fn)(void));
DT_API void dt_alive(void);
/* dt_zero_pages giving back every whole 4 KiB page inside the range, the
 * huge pages at its edges split: only the sub-page ends stay resident.
 * For a block given back range by range every step (ZeRO-3's gathered
 * layers), where dt_zero_pages's cleared edges, up to a huge page each
 * side, add up to much of what was to be given back. */
DT_API void dt_give_pages(void *p, size_t bytes);
/* Maps the pages of p[0, bytes) that were given back, in one call
 * (madvise MADV_POPULATE_WRITE, Linux 5.14), so that writing them takes
 * no page faults; where the kernel cannot, they fault in as they are
 * written, as without it. */
DT_API void dt_take_pages(void *p, size_t bytes);
/* A dt_alloc'd block of `count` elements of `size` bytes of which only the
 * ranges keep[n] (element offsets and lengths, ascending) will be used:
 * the rest gets no huge pages (madvise MADV_NOHUGEPAGE), so that touching
 * a kept range near its edge makes 4 KiB pages, not a 2 MiB one that
 * spans the unused neighbours. */
DT_API void dt_pages_unused(void *base, size_t size, size_t count, const size_t *keep, int n);

/* ---- memory budget --------------------------------------------------------- */

/* Bytes this process may still allocate before the kernel's OOM killer
 * would step in: the least of MemAvailable (/proc/meminfo), what its memory
 * cgroup and that cgroup's parents still allow (cgroup v2 memory.max -
 * memory.current, v1 memory.limit_in_bytes - memory.usage_in_bytes; the
 * cgroup's reclaimable file cache counts as free) and the limit set with
 * dt_mem_set_limit(). *source (may be NULL) gets a static description of
 * the figure that won ("MemAvailable in /proc/meminfo", "cgroup memory.max
 * of /sys/fs/cgroup/...", or the limit's name). SIZE_MAX when nothing can be
 * read and no limit is set. */
DT_API size_t dt_mem_available(const char **source);
/* dt_mem_available() without the limit: what the machine and the memory
 * cgroup allow. */
DT_API size_t dt_mem_machine(const char **source);
/* This process's resident memory now (VmRSS), 0 when unknown. */
DT_API size_t dt_mem_resident(void);
/* Caps this process's memory at `bytes` where the kernel enforces it: a
 * memory cgroup of its own inside the one it is in (v1
 * memory.limit_in_bytes, or v2 memory.max where that cgroup hands the
 * memory controller down; the group is removed at exit, and groups of
 * dtrain processes that were killed are removed by the next cap), else
 * RLIMIT_DATA (which counts mapped, not resident, private memory). `how` gets which, for logs and summary.json.
 * DT_ERR_IO when none can be set. */
DT_API dt_status dt_mem_cap(size_t bytes, char *how, size_t len);
/* After process pid was killed: 1 and a line into out[n] when an
 * out-of-memory killer did it: the one of the cgroup it capped itself with
 * (dt_mem_cap: "killed by its memory cgroup's out-of-memory killer: its cap
 * ... is 2.44 GiB, its use reached 2.44 GiB"), or the kernel's, as its log
 * says where it is readable (/dev/kmsg: "killed by the kernel's
 * out-of-memory killer: the machine ran out of memory"); 0 when not, or
 * when it cannot be told. */
DT_API int dt_mem_cap_oom(long pid, char *out, size_t n);
/* A limit for dt_mem_available() (0: none); `name` describes it in
 * messages, e.g. "--memory-limit 2G" (copied). */
DT_API void dt_mem_set_limit(size_t bytes, const char *name);
/* That limit (0: none) and its name. */
DT_API size_t dt_mem_limit(const char **name);
/* The decimal number at the start of s, as configs and flags write one: a
 * sign, digits, a fraction, an exponent; no hex, inf or nan, no leading
 * zeros ("010" is neither octal 8 nor 10). NULL with *end after it, or
 * what is wrong (a clause for a message, "" when there is no number).
 * *digits (may be NULL): it is only digits, with a sign. */
DT_API const char *dt_decimal_scan(const char *s, const char **end, int *digits);
/* Parses a size: a whole number of bytes, or a number with a suffix K, M,
 * G or T (powers of 1024; "1.5G" allowed; a trailing "B" or "iB" too),
 * the number by dt_decimal_scan's rules.
 * DT_ERR_ARG (nothing recorded) for anything else, zero, or more than
 * 2^60. */
DT_API dt_status dt_mem_parse_size(const char *s, size_t *bytes);
/* "1.50 GiB (1610612736 bytes)" into buf; returns buf. */
DT_API const char *dt_mem_format(size_t bytes, char *buf, size_t n);

/* CRC-32C (Castagnoli) of p[n], continuing from crc (0 to start). Uses the
 * SSE4.2 instruction where the CPU has it. */
DT_API uint32_t dt_crc32c(uint32_t crc, const void *p, size_t n);

/* Text that came from a file, made safe to print on a terminal: s[0, len)
 * into out (n bytes, always NUL-terminated) with control characters (below
 * 0x20, DEL, the C1 controls 0x80-0x9f) and bytes that are not well-formed
 * UTF-8 written as \xNN; other UTF-8 is kept. Escaping escaped text again
 * changes nothing. Stops before an escape or character that would not fit.
 * Returns out. */
DT_API char *dt_escape_text(char *out, size_t n, const char *s, size_t len);

/* The candidate closest to `word` by edit distance (insertions, deletions,
 * substitutions and swaps of neighbours), when it is close enough to be
 * what was meant (at most 2 edits, and fewer than half of word's length);
 * NULL otherwise. For "did you mean" in messages about names. */
DT_API const char *dt_suggest(const char *word, const char *const *cands, int n);

/* Creates directory `path` and its missing parents (mkdir -p). */
DT_API dt_status dt_make_dirs(const char *path);

/* Writes n parts to `path` atomically: a temporary file beside it (made
 * new: never through a planted link), fsync, rename over path, fsync of
 * the directory. Readers see the old file or the whole new one, never a
 * torn write. Only a regular file or a new name is replaced: a device, a
 * link or a directory at path is refused. */
DT_API dt_status dt_write_atomic(const char *path, const void *const *parts,
                                 const size_t *sizes, int n);
/* The same written piece by piece: dt_atomic_open makes the temporary file,
 * dt_atomic_append adds bytes to it, dt_atomic_commit makes it `path` (and
 * frees f, whatever it returns), dt_atomic_abort removes it (f NULL: none). */
typedef struct dt_atomic_file dt_atomic_file;
DT_API dt_status dt_atomic_open(dt_atomic_file **f, const char *path);
DT_API dt_status dt_atomic_append(dt_atomic_file *f, const void *data, size_t n);
/* Writes n bytes at byte offset `at` of the temporary file (a file written
 * out of order: a header rewritten once the bytes after it are known). */
DT_API dt_status dt_atomic_write_at(dt_atomic_file *f, size_t at, const void *data, size_t n);
DT_API dt_status dt_atomic_commit(dt_atomic_file *f);
DT_API void dt_atomic_abort(dt_atomic_file *f);

/* Opens path for reading, refusing anything but a regular file (a FIFO, a
 * device, a socket, a directory: opened without blocking, then checked,
 * so nothing waits on a writer that never comes). */
DT_API dt_status dt_open_read(const char *path, int *fd);
/* The same as a stream ("rb"); NULL with the error recorded. */
DT_API FILE *dt_fopen_read(const char *path);
/* Bytes [off, off + n) of fd (pread, retried until all are read) into dst;
 * DT_ERR_IO naming path on a failed read or a file that ends before. */
DT_API dt_status dt_read_at(int fd, uint64_t off, void *dst, size_t n, const char *path);
/* Opens or creates path for reading and writing (flags: O_APPEND, O_TRUNC
 * to empty it once checked, or 0), refusing a symbolic link as its last
 * component and anything but a regular file: a planted link never
 * redirects a write. */
DT_API dt_status dt_open_write(const char *path, int flags, int *fd);

/* ---- files and objects: local paths and s3://BUCKET/KEY -------------------
 *
 * Every path dtrain reads or writes may name an object in S3-compatible
 * storage, "s3://BUCKET/KEY" (docs/s3.md): dt_write_atomic uploads its
 * parts from the caller's memory, dt_atomic_open ... dt_atomic_commit at
 * commit (the bytes staged in an unlinked file under TMPDIR); a multipart
 * upload when large. dt_open_read and dt_read_file_gz read the
 * whole object, and the calls below see an object as a file and a key
 * prefix ("s3://b/dir/" with objects under it) as a directory. A build
 * without libcurl refuses s3:// paths by name. */

/* Whether path names an object in S3-compatible storage ("s3://..."). */
DT_API int dt_path_remote(const char *path);
/* Whether this build reads and writes s3:// paths (it has libcurl). */
DT_API int dt_s3_available(void);
/* The S3 endpoint and region from a config ([s3] endpoint, region; NULL
 * or "" none): used where the environment names none (AWS_ENDPOINT_URL,
 * AWS_REGION). */
DT_API void dt_s3_configure(const char *endpoint, const char *region);
/* What is at path: *kind 0 nothing, 1 a file (or object; *size its bytes,
 * size may be NULL), 2 a directory (or a prefix with objects under it).
 * DT_ERR_IO only when it cannot be told (a server that refuses or does not
 * answer). */
DT_API dt_status dt_path_kind(const char *path, int *kind, uint64_t *size);
/* The names in directory dir (its entries but "." and ".."; an S3 prefix's
 * objects and sub-prefixes), in no order, as a malloc'd array of malloc'd
 * strings (*n of them; dt_path_list_free frees it). A directory that does
 * not exist has none (DT_OK). */
DT_API dt_status dt_path_list(const char *dir, char ***names, int *n);
DT_API void dt_path_list_free(char **names, int n);
/* Removes a file or object (one that is not there: DT_OK). */
DT_API dt_status dt_path_remove(const char *path);
/* Removes an empty directory (an S3 prefix: nothing to remove). */
DT_API void dt_path_rmdir(const char *path);

/* A file or object open for reading by ranges: dt_rfile_read gives bytes
 * [off, off + n) (all of them, or DT_ERR_IO naming the path and where it
 * ends). A local file is read with pread; an object by ranged GETs, small
 * reads through a block kept from the last one (the read-ahead: 1 MiB from
 * the read's offset, or dt_rfile_set_block's), large ones in 8 MiB pieces
 * fetched four at a time. Safe to read from several threads. */
typedef struct dt_rfile dt_rfile;
DT_API dt_status dt_rfile_open(dt_rfile **f, const char *path);
DT_API uint64_t dt_rfile_size(const dt_rfile *f);
DT_API dt_status dt_rfile_read(dt_rfile *f, uint64_t off, void *dst, size_t n);
/* An object's read-ahead: a read of less than a quarter of `bytes` fetches
 * `bytes` from its offset (fewer at the object's end) and keeps them for
 * the reads that follow; 0: every read fetches exactly its bytes (a reader
 * that knows its ranges: a rank's shard of a data file). Default 1 MiB
 * (a safetensors header's two reads cost one GET). Nothing for a file. */
DT_API void dt_rfile_set_block(dt_rfile *f, size_t bytes);
DT_API void dt_rfile_close(dt_rfile *f);
/* Bytes this process has received from object storage (the bodies of its
 * GETs, every object's) since it started: summary.json's
 * io.ranks_s3_read_bytes. 0 in a build without libcurl. */
DT_API uint64_t dt_s3_bytes_read(void);

/* Reads a whole file, gunzipping it when it is gzip-compressed, up to max
 * bytes uncompressed (what the caller knows the file holds: a header's
 * claim) and never more than 4 GiB (max 0: that limit); more is
 * DT_ERR_FORMAT, found once max + 1 bytes are inflated: a gzip bomb never
 * takes the machine's memory. On success *buf is malloc'ed (caller frees)
 * and *len its size. */
DT_API dt_status dt_read_file_gz(const char *path, size_t max, uint8_t **buf, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
