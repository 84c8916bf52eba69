/* Federated averaging's parts that stand alone (engine/federated/fedparts.c): how
 * the training set is split over simulated clients, and the pairwise masks
 * of secure aggregation. engine/federated/federate.c runs the rounds with them
 * (dt_federate, docs/federated.md). */
#ifndef DT_ENGINE_FEDPARTS_H
#define DT_ENGINE_FEDPARTS_H

#include "dtrain/config.h"

/* Splits the samples 0..n-1 (labels y[n] in [0, classes)) over
 * c->fed_clients clients as [federated] partition says, from c->seed:
 *   iid        a shuffle cut into equal parts;
 *   shards     the samples sorted by label, cut into clients x shards
 *              shards, each client given `shards` of them at random (the
 *              FedAvg paper's pathological non-IID split);
 *   dirichlet  for each class, proportions over the clients drawn from
 *              Dirichlet(alpha), the class's samples cut by them (label
 *              skew: small alpha, few classes per client).
 * Client k's samples are (*idx)[(*start)[k] .. (*start)[k + 1]); both
 * arrays malloc'd, the caller frees them. DT_ERR_CONFIG naming the field
 * when there are fewer samples than clients (or than shards). */
dt_status dt_fed_partition(const dt_config *c, const int32_t *y, int n, int classes, uint32_t **idx, int **start);

/* ---- secure aggregation -------------------------------------------------
 * Each client sends its weighted update in fixed point (DT_SECAGG_FRAC_BITS
 * fraction bits, two's complement mod 2^32) plus, for every other client j
 * of the round, a mask m_kj shared with j: added when k < j, subtracted
 * when k > j. In the sum over the round's clients the masks cancel mod
 * 2^32, so the server learns the sum and nothing of one client's update
 * beyond it (Bonawitz et al., CCS 2017). A mask is a counter-mode stream
 * from a pair seed; here the seeds come from `key` (the run's seed and the
 * round), which simulates the key agreement of the protocol: the
 * arithmetic is real, the secrecy of the seeds is not. */
#define DT_SECAGG_FRAC_BITS 24  /* weighted values within +-128, resolution 6e-8 */

/* out[n] = fixed(weight * x[i]) (clamped into the signed range) + masks of client `me` against every other
 * client in clients[m], mod 2^32. */
void dt_secagg_mask(uint32_t *out, const float *x, size_t n, double weight, int me, const int *clients, int m,
                    uint64_t key);
/* Removes from sum[n] the masks that the clients survivors[ns] added
 * against the clients dropped[nd], which sent nothing: what the survivors
 * reveal when the server names the dropped clients. */
void dt_secagg_unmask(uint32_t *sum, size_t n, const int *survivors, int ns, const int *dropped, int nd,
                      uint64_t key);
/* The fixed-point sum back to floats: out[i] = signed(sum[i]) / 2^FRAC. */
void dt_secagg_decode(const uint32_t *sum, float *out, size_t n);

#endif
