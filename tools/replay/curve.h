/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The hit-ratio curve of `umbp replay --capacity-sweep`: the capacity that
 * reaches a fraction of the unbounded ratio, and the curve as an SVG picture
 * (written here, no plotting dependency) or CSV.
 *
 * The SVG is meant to be read by people and checked by programs: every
 * plotted point is a <circle> with class "blocks" or "tokens" and the exact
 * figures in data-capacity (bytes) and data-ratio (0..1, %.10g, the same
 * digits as --json), the unbounded ratios are <line> elements with class
 * "unbounded-blocks"/"unbounded-tokens" and data-ratio, and the 95% mark is a
 * <line class="knee"> with data-capacity.
 */
#ifndef UMBP_REPLAY_CURVE_H
#define UMBP_REPLAY_CURVE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct curve_point {
  uint64_t capacity; /* bytes of slots */
  uint64_t slots;
  bool unbounded;
  double cache_ratio, token_ratio; /* blocks hit / whole blocks; hit tokens / input tokens */
  uint64_t blocks_hit, blocks_total, evictions;
};

/* The unbounded cache ratio of pts (the last unbounded point) into *ret_unb,
 * and the index of the smallest bounded capacity whose cache ratio reaches
 * frac of it into *ret_knee (-1: none does). -ENOENT when pts has no
 * unbounded point. */
int curve_knee(const struct curve_point *pts, unsigned n, double frac, double *ret_unb, int *ret_knee);

/* The curve of the bounded points as SVG (log x axis when the capacities
 * span more than 10x), with the unbounded ratios and the knee (index from
 * curve_knee, -1: none) marked; title is escaped. 0 or -EIO. */
int curve_svg(FILE *f, const struct curve_point *pts, unsigned n, int knee, const char *title);

/* One header line, then one line per point, in the order given. 0 or -EIO. */
int curve_csv(FILE *f, const struct curve_point *pts, unsigned n);

#endif
