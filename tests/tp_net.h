/* The tensor-parallel test network of test_layers and test_conv. Pairs:
 * conv 32 (column) | relu, maxpool, dropout | conv 8 (row, its relu after
 * the sum); conv 4 (column) | gelu, flatten | linear 10 (row); then linear
 * 12 followed by layernorm pairs with nothing: whole. Input 3 x 8 x 8. */
#ifndef DT_TESTS_TP_NET_H
#define DT_TESTS_TP_NET_H

#include "dtrain/nn.h"

static const dt_layer_spec TP_NET[] = {
    {.kind = DT_LAYER_CONV2D, .out = 32, .kernel = 3, .stride = 1, .pad = 1},
    {.kind = DT_LAYER_RELU},
    {.kind = DT_LAYER_MAXPOOL, .kernel = 2},
    {.kind = DT_LAYER_DROPOUT, .p = 0.25f},
    {.kind = DT_LAYER_CONV2D, .out = 8, .kernel = 3, .stride = 1, .pad = 1},
    {.kind = DT_LAYER_RELU},
    {.kind = DT_LAYER_CONV2D, .out = 4, .kernel = 3, .stride = 1},
    {.kind = DT_LAYER_GELU},
    {.kind = DT_LAYER_FLATTEN},
    {.kind = DT_LAYER_LINEAR, .out = 10},
    {.kind = DT_LAYER_LINEAR, .out = 12},
    {.kind = DT_LAYER_LAYERNORM},
    {.kind = DT_LAYER_LINEAR, .out = 5},
};
#define TP_N ((int)(sizeof TP_NET / sizeof *TP_NET))
static const int TP_IN[3] = {3, 8, 8};

#endif
