/* nccl_api.h - the part of NCCL's API (nccl.h, 2.18 and later) that the
 * nccl backend calls through dlsym, declared here so that it compiles
 * without NCCL's header; the tests' fake NCCL (tests/fake_nccl.c)
 * implements the same. Values and layouts are NCCL's own (stable across
 * 2.x). */
#ifndef DT_COMM_NCCL_API_H
#define DT_COMM_NCCL_API_H

#include <limits.h>
#include <stddef.h>

typedef struct ncclComm *ncclComm_t;
typedef void *cudaStream_t_;  /* a cudaStream_t */

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

typedef enum {
    ncclInt8 = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclFloat32 = 7,
    ncclFloat64 = 8,
    ncclBfloat16 = 9,
} ncclDataType_t;

/* ncclConfig_t as NCCL 2.18 lays it out: later versions read a config by
 * its size and version, so this prefix of theirs is one of theirs. */
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
} dt_nccl_config;

#define DT_NCCL_CONFIG_MAGIC 0xcafebeef
#define DT_NCCL_CONFIG_VERSION 21800 /* NCCL_VERSION(2, 18, 0) */
#define DT_NCCL_UNDEF_INT INT_MIN

typedef ncclResult_t (*nccl_get_version_fn)(int *version);
typedef ncclResult_t (*nccl_get_unique_id_fn)(ncclUniqueId *id);
typedef ncclResult_t (*nccl_comm_init_rank_config_fn)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                                      dt_nccl_config *config);
typedef ncclResult_t (*nccl_comm_get_async_error_fn)(ncclComm_t comm, ncclResult_t *async_error);
typedef ncclResult_t (*nccl_comm_fn)(ncclComm_t comm); /* ncclCommAbort, ncclCommDestroy */
typedef const char *(*nccl_get_error_string_fn)(ncclResult_t r);
typedef const char *(*nccl_get_last_error_fn)(ncclComm_t comm);
typedef ncclResult_t (*nccl_all_reduce_fn)(const void *send, void *recv, size_t count, ncclDataType_t t,
                                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t_ stream);
typedef ncclResult_t (*nccl_reduce_scatter_fn)(const void *send, void *recv, size_t recvcount, ncclDataType_t t,
                                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t_ stream);
typedef ncclResult_t (*nccl_all_gather_fn)(const void *send, void *recv, size_t sendcount, ncclDataType_t t,
                                           ncclComm_t comm, cudaStream_t_ stream);
typedef ncclResult_t (*nccl_broadcast_fn)(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                                          ncclComm_t comm, cudaStream_t_ stream);
typedef ncclResult_t (*nccl_reduce_fn)(const void *send, void *recv, size_t count, ncclDataType_t t,
                                       ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t_ stream);

typedef ncclResult_t (*nccl_send_fn)(const void *send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                                     cudaStream_t_ stream);
typedef ncclResult_t (*nccl_recv_fn)(void *recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                                     cudaStream_t_ stream);

#endif
