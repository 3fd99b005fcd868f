#include "progress.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

#include "units.h"

#define REDRAW_SECONDS 0.1
#define MIN_SECONDS    0.05 /* less than this says nothing of a rate */

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int ctl_progress_wanted(int json)
{
	return !json && isatty(2);
}

/* "42s", "3m20s", "2h05m". */
static void format_eta(double seconds, char *out, size_t outsz)
{
	uint64_t s = seconds < 0 ? 0 : (uint64_t)(seconds + 0.5);
	if (s < 60)
		snprintf(out, outsz, "%us", (unsigned)s);
	else if (s < 3600)
		snprintf(out, outsz, "%um%02us", (unsigned)(s / 60), (unsigned)(s % 60));
	else
		snprintf(out, outsz, "%uh%02um", (unsigned)(s / 3600), (unsigned)(s / 60 % 60));
}

void ctl_progress_format(const char *what, uint64_t done, uint64_t total, double seconds, char *out,
                         size_t outsz)
{
	char d[32], t[32];
	units_format_size(done, d, sizeof(d));
	units_format_size(total, t, sizeof(t));
	unsigned pct = done >= total ? 100 : (unsigned)((double)done * 100.0 / (double)total);
	int n = snprintf(out, outsz, "%s %s of %s (%u%%)", what, d, t, pct);
	if (n < 0 || (size_t)n >= outsz || !done || seconds < MIN_SECONDS)
		return;
	double rate = (double)done / seconds;
	char r[32], left[32] = "";
	units_format_size((uint64_t)rate, r, sizeof(r));
	if (done < total)
		format_eta((double)(total - done) / rate, left, sizeof(left));
	snprintf(out + n, outsz - (size_t)n, ", %s/s, %s%s", r, *left ? "ETA " : "done", left);
}

static void draw(struct ctl_progress *p, double t)
{
	char line[192];
	ctl_progress_format(p->what, p->done, p->total, t - p->start, line, sizeof(line));
	/* \r and erase to the end of the line: a shorter line leaves nothing */
	fprintf(p->out, "\r%s\033[K", line);
	fflush(p->out);
	p->drawn = t;
	p->shown = 1;
}

void ctl_progress_begin(struct ctl_progress *p, FILE *out, const char *what, uint64_t total)
{
	memset(p, 0, sizeof(*p));
	p->out = out;
	if (!out)
		return;
	snprintf(p->what, sizeof(p->what), "%s", what);
	p->total = total;
	p->start = now();
	draw(p, p->start);
}

void ctl_progress_note(struct ctl_progress *p, FILE *out, const char *text)
{
	memset(p, 0, sizeof(*p));
	p->out = out;
	p->note = 1;
	if (!out)
		return;
	fprintf(out, "\r%s\033[K", text);
	fflush(out);
	p->shown = 1;
}

void ctl_progress_add(struct ctl_progress *p, uint64_t bytes)
{
	if (!p->out || p->note || !bytes)
		return;
	int was_done = p->done >= p->total;
	p->done += bytes;
	double t = now();
	if (t - p->drawn >= REDRAW_SECONDS || (p->done >= p->total && !was_done))
		draw(p, t);
}

void ctl_progress_end(struct ctl_progress *p)
{
	if (p->out && p->shown) {
		fputs("\r\033[K", p->out);
		fflush(p->out);
	}
	memset(p, 0, sizeof(*p));
}
