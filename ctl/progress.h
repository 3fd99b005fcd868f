/* progress: one line of progress on stderr for k3cachectl's long commands
 * (export, import): bytes done of the total, the rate and the time left,
 * redrawn in place at most ten times a second and always at 100%, then
 * cleared, so the command's own report follows on a clean line. Shown only
 * on a terminal and never with --json (ctl_progress_wanted): a pipe, a log
 * or a script sees nothing of it. */
#ifndef K3_CTL_PROGRESS_H
#define K3_CTL_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

struct ctl_progress {
	FILE *out; /* NULL: off (every call does nothing) */
	char what[96];
	uint64_t done, total;
	double start, drawn; /* monotonic seconds: the start, the last draw */
	int shown;           /* a line is on the screen */
	int note;            /* the line is a note: no counts */
};

/* Whether to show progress: stderr is a terminal and the output not JSON. */
int ctl_progress_wanted(int json);

/* Starts a line "WHAT 0 B of TOTAL (0%)" on out (stderr when shown; NULL for
 * off); `what` is copied. */
void ctl_progress_begin(struct ctl_progress *p, FILE *out, const char *what, uint64_t total);

/* A line of text alone, for a step that cannot count its bytes (the
 * daemon's verify, a publish the library sends whole), shown until
 * ctl_progress_end(). */
void ctl_progress_note(struct ctl_progress *p, FILE *out, const char *text);

/* Counts `bytes` more done, and redraws when it is time. */
void ctl_progress_add(struct ctl_progress *p, uint64_t bytes);

/* Clears the line (the report that follows says what happened). */
void ctl_progress_end(struct ctl_progress *p);

/* The text of a line after `seconds`: "WHAT DONE of TOTAL (P%), RATE/s, ETA
 * T", or at the end "..., RATE/s, done"; without the rate and the time left
 * while too little has passed to say (under 50 ms, or nothing done). */
void ctl_progress_format(const char *what, uint64_t done, uint64_t total, double seconds, char *out,
                         size_t outsz);

#endif
