/*
 * Every internal header at once: for tests and fuzz targets, which reach into any layer. No core
 * file includes it: each includes the header of its own layer (src/README.md), which includes
 * those below.
 */
#ifndef KVX_INT_H
#define KVX_INT_H

#include "engine/kvx_engine.h"

#endif /* KVX_INT_H */
