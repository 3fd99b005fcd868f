/* Helpers shared by the unit tests: reading fixture files from shared/. */
#ifndef K3_TESTUTIL_H
#define K3_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads a whole file under K3_SHARED_DIR; returns a malloc'd buffer (never
 * NULL, at least one byte allocated) and its length, or aborts the test. */
static inline unsigned char *testutil_read(const char *rel, size_t *len)
{
	char path[1024];
	snprintf(path, sizeof(path), "%s/%s", K3_SHARED_DIR, rel);
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "cannot open fixture %s\n", path);
		abort();
	}
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	unsigned char *buf = malloc((size_t)n + 1);
	if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n)
		abort();
	fclose(f);
	*len = (size_t)n;
	return buf;
}

/* Splits a TSV fixture into rows of fields. Returns the number of data rows
 * (the header is skipped); rows[i][j] point into the returned buffer. */
#define TESTUTIL_MAX_ROWS 128
#define TESTUTIL_MAX_COLS 8
static inline char *testutil_tsv(const char *rel, char *rows[][TESTUTIL_MAX_COLS], int *nrows)
{
	size_t len;
	char *text = (char *)testutil_read(rel, &len);
	text[len] = '\0';
	int r = -1;
	char *save = NULL;
	for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (r >= 0) {
			if (r >= TESTUTIL_MAX_ROWS)
				abort();
			int c = 0;
			char *p = line;
			while (c < TESTUTIL_MAX_COLS) {
				rows[r][c++] = p;
				char *tab = strchr(p, '\t');
				if (!tab)
					break;
				*tab = '\0';
				p = tab + 1;
			}
			while (c < TESTUTIL_MAX_COLS)
				rows[r][c++] = "";
		}
		r++;
	}
	*nrows = r < 0 ? 0 : r;
	return text;
}

#endif
