/* Communicators over device memory (docs/gpu.md, "Several ranks"): the
 * collectives of dtrain/comm.h on buffers that are a GPU's, made over a
 * host communicator and taking its ranks. Two backends, in registry.c's
 * second table:
 *
 *   nccl     NCCL (loaded at run time: gpu.h's dt_gpu_lib_open), one GPU
 *            a rank; its communicator bootstrapped through the host's
 *            (rank 0's unique id broadcast) and non-blocking, so that
 *            every wait is a poll under the host communicator's timeout
 *            (comm/nccl/nccl.c).
 *   staging  each collective copied to a pinned host buffer, run by the
 *            host's backend (shm, MPI) and copied back: ranks that share a
 *            GPU, or no NCCL (comm/staging/staging.c).
 *
 * A device communicator is a dt_comm_t: the front end numbers its
 * collectives, times them out, keeps its sticky error and its
 * non-blocking twins, and moves its point-to-point transfers (dt_isend,
 * dt_irecv: NCCL's send waits on the GPU for its receive, and one
 * communicator's transfers run in order, so a caller with transfers both
 * ways between two ranks keeps a communicator a way: the pipeline's
 * dev_links); it has no split, rejoin or check mode (the staging's host
 * communicator checks its own). */
#ifndef DT_COMM_DEVICE_H
#define DT_COMM_DEVICE_H

#include "dtrain/comm.h"
#include "gpu/dev.h"

typedef struct {
    const dt_dev *d;    /* the device seam; its buffers are d's */
    int device;         /* the GPU this rank uses (d->use done) */
    const char *shared; /* NULL: no other rank of this host uses it; else
                           why it is shared, for the log ("2 ranks on 1 GPU") */
} dt_comm_device_params;

/* Makes *out over `host` (a collective over host, which must outlive
 * *out): the backend DTRAIN_GPU_COMM names ("nccl", "staging"), or with
 * "auto" (or unset) nccl where every rank can use it, else staging. why[n]
 * says why that one (for the log). A forced backend that some rank cannot
 * use is refused on every rank, naming the rank and why. */
dt_status dt_comm_init_device(dt_comm_t host, const dt_comm_device_params *p, dt_comm_t *out, char *why, size_t n);

/* dt_iallreduce on device communicator c whose input is final once the
 * kernels marked by `event` (dev.h's event_record, taken by the caller when
 * they were queued) have run: NCCL queues it on its stream after that
 * event, not after every kernel queued by the time the progress thread
 * issues it. The staging backend's copies are the kernels' stream's own,
 * after every kernel queued before them, which covers it. */
dt_status dt_iallreduce_after(const void *send, void *recv, size_t count, dt_dtype dtype, dt_redop op, void *event,
                              dt_comm_t c, dt_request_t *req);
/* dt_ireduce (to rank root) after the kernels marked by `event`, as above. */
dt_status dt_ireduce_after(const void *send, void *recv, size_t count, dt_dtype dtype, dt_redop op, int root,
                           void *event, dt_comm_t c, dt_request_t *req);

#endif
