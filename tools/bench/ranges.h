/*
 * kvx-bench --regions: transfers of byte-range lists between registered regions.
 */
#ifndef KVX_BENCH_RANGES_H
#define KVX_BENCH_RANGES_H

#include "opts.h"
#include "report.h"

/* The ranges mode against the servers on ctl: one result per op ("wranges", "rranges")
 * appended at res_out[*nres]. */
void ranges_run(const struct opts *o, int *ctl, result_t *res_out, int *nres);

#endif
