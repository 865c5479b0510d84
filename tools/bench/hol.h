/*
 * kvx-bench --hol: head-of-line latency, urgent transfers beside bulk writes.
 */
#ifndef KVX_BENCH_HOL_H
#define KVX_BENCH_HOL_H

#include "opts.h"

/* --hol against the one server on ctl[0]: prints its own result; 1 when a byte was wrong. */
int hol_run(const struct opts *o, int *ctl);

#endif
