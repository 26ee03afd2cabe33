/* kiln.c — the one binary: run, inspect, convert, mkmodel (more subcommands as they land).
 * Uses only the public API in kiln.h. */
#include "kiln.h"
#include <stdio.h>
#include <string.h>

static int usage(void) {
    fprintf(stderr, "usage: kiln <run|inspect|convert|mkmodel> ...\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    (void)argv;
    return usage();
}
