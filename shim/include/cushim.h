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

/* Sleep mode (sleep_mode:True in CUSHIM_ALLOC_CONF; docs/SLEEP-MODE.md). cudaMalloc and
 * cuMemAlloc memory is tagged by the innermost tag the thread pushed, else by its NVTX range
 * path, else "default". Each returns 0 or a CUDA error code:
 * 801 (not supported) when sleep mode is off, 2 (out of memory) when a resume lacks device
 * memory (the tag stays paused, resumable later), 900 when a pause meets a running graph
 * capture, 214 when a host backup no longer matches its checksum, 1 for a bad argument. */
int cushim_tag_push(const char *tag);
int cushim_tag_pop(void);
/* Wait for the device, release the cache's free memory and the device memory of every block
 * of tag (NULL: every tag), keeping their addresses. mode 0: contents discarded; mode 1:
 * copied to host memory first. An unknown tag pauses 0 bytes; pausing twice, nothing more. */
int cushim_pause(const char *tag, int mode);
/* Map device memory again at the same addresses and restore backed-up contents (checked by
 * a checksum); all or nothing. Resuming a tag that is not paused does nothing. */
int cushim_resume(const char *tag);
/* Bytes of tag (NULL: every tag) now paused, or -1 when sleep mode is off. */
long long cushim_paused_bytes(const char *tag);

#ifdef __cplusplus
}
#endif

#endif
