/*
 * kvx-bench --load: random traffic for a set time, every block read back and compared.
 */
#ifndef KVX_BENCH_LOAD_H
#define KVX_BENCH_LOAD_H

#include "opts.h"
#include "report.h"

#include <stdint.h>

/* --load at one block size against the servers on ctl: one result ("load") appended at
 * res_out[*nres]. */
void load_run(const struct opts *o, int *ctl, uint64_t size, result_t *res_out, int *nres);

#endif
