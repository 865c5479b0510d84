/*
 * kvx-bench's server: target regions for initiators, over the control channel.
 */
#ifndef KVX_BENCH_SERVER_H
#define KVX_BENCH_SERVER_H

#include "opts.h"

#include <stdbool.h>

/* Serve on the listening socket lfd until every client has said BYE (once == true) or forever;
 * closes lfd. o: the regions' settings (threads, rndv, --owned, --max-region, --bind). */
int server_run(int lfd, bool once, const struct opts *o);

#endif
