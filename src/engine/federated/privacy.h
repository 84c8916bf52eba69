/* DP-FedAvg's privacy accountant (engine/federated/privacy.c): the Rényi
 * differential privacy (RDP) of the sampled Gaussian mechanism, composed
 * over rounds and converted to (epsilon, delta), and the noise multiplier
 * that a target epsilon allows (docs/federated.md, "Differential privacy").
 *
 * One round adds N(0, sigma^2 C^2) to the sum of the sampled clients'
 * updates, each clipped to norm C, with each client sampled at rate q. At
 * an integer order alpha >= 2 its RDP is (Mironov, Talwar and Zhang,
 * "Rényi Differential Privacy of the Sampled Gaussian Mechanism", 2019,
 * Sec. 3.3; the moments accountant of Abadi et al., CCS 2016):
 *
 *   rdp(alpha) = log A / (alpha - 1),
 *   A = sum_{k=0}^{alpha} binom(alpha, k) (1 - q)^(alpha - k) q^k exp((k^2 - k) / (2 sigma^2))
 *
 * which for q = 1 is the plain Gaussian mechanism's alpha / (2 sigma^2).
 * T rounds compose to T rdp(alpha), and (epsilon, delta) follows from
 * (Canonne, Kamath and Steinke 2020, Prop. 12; Balle et al. 2020, Thm. 21)
 *
 *   epsilon = min over alpha of T rdp(alpha) + log((alpha - 1) / alpha) - (log delta + log alpha) / (alpha - 1)
 *
 * over the integer orders 2 .. DT_RDP_MAX_ORDER. */
#ifndef DT_ENGINE_PRIVACY_H
#define DT_ENGINE_PRIVACY_H

#define DT_RDP_MAX_ORDER 256

/* One round's RDP at the integer order alpha >= 2 (sigma > 0, q in (0, 1]). */
double dt_rdp_sampled_gaussian(double q, double sigma, int alpha);
/* The epsilon that `rounds` rounds spend at delta; *order (NULL or) the
 * order that gave it. Infinity for sigma <= 0. */
double dt_rdp_epsilon(double q, double sigma, int rounds, double delta, int *order);
/* The smallest sigma (to 1e-4 relative) whose `rounds` rounds spend at most
 * epsilon at delta. */
double dt_rdp_noise_for(double q, int rounds, double delta, double epsilon);

#endif
