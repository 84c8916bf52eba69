/* What the kernels' two doors to oneDNN (gemm.c, conv.c) share: the one
 * CPU engine, the status check, and the precision the GEMMs and
 * convolutions run in (kernels.h). Private to src/kernels. */
#ifndef DT_KERNELS_ONEDNN_H
#define DT_KERNELS_ONEDNN_H

#include "dtrain/core.h"

#include <oneapi/dnnl/dnnl.h>

dnnl_engine_t dt_onednn_engine(void);
/* Aborts with a message on anything but success: shapes are checked before
 * they reach the kernels, so a failure is a programmer error or the machine
 * out of memory. */
void dt_onednn_check(dnnl_status_t s, const char *what);
/* A memory object of md over the caller's data (destroy it after use). */
dnnl_memory_t dt_onednn_memory(const dnnl_memory_desc_t *md, const void *data);
/* The precision set with dt_kernels_set_precision, and whether oneDNN
 * runs it in kernels of its own here (else: rounded inputs, fp32 math). */
dt_dtype dt_onednn_precision(int *native);

#endif
