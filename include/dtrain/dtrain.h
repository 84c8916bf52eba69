/*
 * dtrain.h - the umbrella header of libdtrain.
 *
 * Train a Fashion-MNIST classifier from C in a dozen lines:
 *
 *   #include <dtrain/dtrain.h>
 *
 *   dt_config c;
 *   if (dt_config_load(&c, "configs/fashion-cnn.ini", NULL, 0) != DT_OK) {
 *       fprintf(stderr, "%s\n", dt_last_error());
 *       return 1;
 *   }
 *   dt_train_result r;
 *   if (dt_train(&c, "runs/demo", NULL, NULL, &r) != DT_OK) {
 *       fprintf(stderr, "%s\n", dt_last_error());
 *       return 1;
 *   }
 *   printf("test accuracy %.4f\n", r.test_accuracy);
 *
 * Or drive the pieces yourself: dt_model_create + dt_model_forward/backward
 * over the flat parameter block, dt_optim_step, dt_loader_next. The headers:
 *
 *   core.h    status codes, errors, logging, rng, threads, atomic files
 *   nn.h      layer kernels (forward/backward pairs), sequential models
 *   optim.h   SGD, AdamW, schedules, clipping
 *   data.h    IDX files, datasets, the prefetching loader
 *   ckpt.h    safetensors read/write, model weights
 *   config.h  INI run configs
 *   train.h   whole training and evaluation runs
 *   comm.h    communicators and collectives (shared memory, MPI)
 *   launch.h  the local launcher behind `dtrain run`
 *   gpt.h     GPT-2 language models, token files, llm.c weights
 *
 * Link with pkg-config --libs dtrain, or find_package(dtrain) in CMake.
 */
#ifndef DTRAIN_H
#define DTRAIN_H

#include "dtrain/core.h"
#include "dtrain/spec.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/data.h"
#include "dtrain/ckpt.h"
#include "dtrain/config.h"
#include "dtrain/train.h"
#include "dtrain/gpt.h"
#include "dtrain/recsys.h"
#include "dtrain/comm.h"
#include "dtrain/launch.h"

#endif
