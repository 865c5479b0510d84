/*
 * kvx-bench --reg-cost: what kvx_region_register and kvx_region_deregister cost per call.
 */
#ifndef KVX_BENCH_REGCOST_H
#define KVX_BENCH_REGCOST_H

#include "opts.h"

/* --reg-cost: no server; prints its own table (or JSON lines). Returns the exit code. */
int regcost_run(const struct opts *o);

#endif
