/*
 * Every internal header at once: for tests and fuzz targets, which reach into any layer, the
 * transport seen whole (api/transport.h) included. No core file includes it: each includes the
 * header of its own layer (src/README.md), which includes those below.
 */
#ifndef KVX_INT_H
#define KVX_INT_H

#include "api/transport.h"

#endif /* KVX_INT_H */
