/* A gate for host functions: `held_set(p)` keeps its stream busy until the program calls
 * `gate_open()`, then writes 1 to *p. A case that asserts something did NOT wait for a stream
 * holds that stream with it, so the stream is still busy when the case checks, however loaded
 * the machine (a sleep of any length can be outlasted by a descheduled main thread). The wait
 * gives up after 60 s with a line on stderr, so a wrong ordering (the checking side waiting
 * for the held stream) makes the case fail instead of hanging. */
#ifndef SIM_GATE_H
#define SIM_GATE_H
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

static atomic_int gate_is_open;

static inline void gate_open(void) { atomic_store(&gate_is_open, 1); }

static inline void gate_wait(void) {
    for (int i = 0; i < 60000 && !atomic_load(&gate_is_open); i++) usleep(1000);
    if (!atomic_load(&gate_is_open)) fprintf(stderr, "gate: still closed after 60 s\n");
}

/* Holds the stream until the gate opens, then sets *p. */
static inline void held_set(void *p) {
    gate_wait();
    *(volatile int *)p = 1;
}
#endif
