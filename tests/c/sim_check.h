/* Shared checking macros for the simcuda test programs: EXPECT(code, call) fails the
 * program (exit 1) with a message naming the call when the call returns another code. */
#ifndef SIM_CHECK_H
#define SIM_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define EXPECT(want, call) do { int got_ = (int)(call); if (got_ != (int)(want)) { \
    fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__, __LINE__, #call, got_, (int)(want)); \
    exit(1); } } while (0)
#define REQUIRE(cond) do { if (!(cond)) { \
    fprintf(stderr, "%s:%d: requirement failed: %s\n", __FILE__, __LINE__, #cond); exit(1); } } while (0)
/* CASE(name) runs its block when argv[1] is name and marks the case known; PASS_CASE() ends
 * main: an unknown case name fails the program (exit 2) instead of passing with no check. */
static int sim_case_known_ __attribute__((unused));
#define CASE(name) if (!strcmp(argv[1], name) && (sim_case_known_ = 1))
#define CASES_END() do { if (!sim_case_known_) { \
    fprintf(stderr, "unknown case: %s\n", argv[1]); exit(2); } } while (0)
#define PASS_CASE() do { CASES_END(); printf("PASS %s\n", argv[1]); } while (0)
#endif
