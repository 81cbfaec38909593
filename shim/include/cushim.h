/* cushim's C API, for programs that want control over the preloaded allocator.
 * Each function is exported by libcushim.so; a program that may run without the shim can
 * look them up with dlsym(RTLD_DEFAULT, "cushim_empty_cache") instead of linking them. */
#ifndef CUSHIM_H
#define CUSHIM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Release every cached block (and unmapped expandable page) to the device. 0, or -1 when the
 * shim is inactive. */
int cushim_empty_cache(void);

/* Reset peak statistics. 0, or -1 when inactive. */
int cushim_reset_peak_stats(void);

/* Write the memory statistics as JSON into buf (NUL-terminated, truncated to len). Returns
 * the full length without the NUL (call with len 0 to size the buffer), or -1. */
int cushim_memory_stats_json(char *buf, size_t len);

/* Write a snapshot now, to path, or to the CUSHIM_SNAPSHOT template when path is NULL.
 * 0 on success, -1 on failure (reported on stderr). */
int cushim_dump_snapshot(const char *path);

#ifdef __cplusplus
}
#endif

#endif
