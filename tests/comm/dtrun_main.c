/* dtrun: `dtrain run` on its own (the same cmd_run.c), so that the
 * communication tests can start ranks without the rest of the CLI. */
#include "cli.h"

int main(int argc, char **argv) { return cmd_run(argc, argv); }
