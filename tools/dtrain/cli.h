/* The dtrain command-line tool: one file per subcommand. Each cmd_* gets
 * argv starting at its own name and returns the process exit code:
 * 0 success, 1 runtime error, 2 usage error. */
#ifndef DT_CLI_H
#define DT_CLI_H

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_prepare_text(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_export(int argc, char **argv);

/* Prints "dtrain: error: ..." to stderr, control characters escaped
 * (dt_escape_text). */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
