/* SPDX-License-Identifier: Apache-2.0 */
/* The hit-ratio curve as SVG and CSV (see curve.h). */
#include "curve.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "cli.h"

int curve_knee(const struct curve_point *pts, unsigned n, double frac, double *ret_unb, int *ret_knee) {
  int u = -1;
  for (unsigned i = 0; i < n; i++)
    if (pts[i].unbounded) u = (int)i;
  if (u < 0) return -ENOENT;
  double target = frac * pts[u].cache_ratio;
  int knee = -1;
  /* a trace with no hit even unbounded: every capacity "reaches" 95% of 0,
   * which names none of them */
  for (unsigned i = 0; pts[u].cache_ratio > 0 && i < n; i++) {
    if (pts[i].unbounded || pts[i].cache_ratio < target) continue;
    if (knee < 0 || pts[i].capacity < pts[knee].capacity) knee = (int)i;
  }
  *ret_unb = pts[u].cache_ratio;
  *ret_knee = knee;
  return 0;
}

/* Length (2..4) of the well-formed UTF-8 sequence of a character XML 1.0
 * allows at s, or 0. The title holds the trace's path, and a file name is
 * bytes: one that is not UTF-8, or a character cut by the title's bound,
 * would make the SVG (declared UTF-8) not well-formed. */
static int utf8_len(const unsigned char *s) {
  unsigned c = s[0], cp, min;
  int n;
  if ((c & 0xe0) == 0xc0) {
    n = 2, cp = c & 0x1f, min = 0x80;
  } else if ((c & 0xf0) == 0xe0) {
    n = 3, cp = c & 0x0f, min = 0x800;
  } else if ((c & 0xf8) == 0xf0) {
    n = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  for (int i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0; /* also stops at the terminating NUL */
    cp = cp << 6 | (s[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || cp == 0xfffe || cp == 0xffff) return 0;
  return n;
}

static void xml_text(FILE *f, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '&': fputs("&amp;", f); break;
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '"': fputs("&quot;", f); break;
    default:
      if ((unsigned char)*s >= 0x80) { /* a byte that is not UTF-8 becomes '?' */
        int n = utf8_len((const unsigned char *)s);
        if (n) {
          fwrite(s, 1, (size_t)n, f);
          s += n - 1;
        } else {
          fputc('?', f);
        }
      } else if ((unsigned char)*s >= 0x20 || *s == '\t') {
        fputc(*s, f); /* XML 1.0 refuses other controls */
      }
    }
  }
}

/* Plot geometry: the plot area inside the picture. */
enum { W = 760, H = 460, L = 70, R = 190, T = 50, B = 70 };

struct xscale {
  bool log;
  double lo, hi;
};

static double xpos(const struct xscale *x, uint64_t cap) {
  double v = (double)cap, t;
  if (x->hi <= x->lo) t = 0.5;
  else if (x->log) t = (log(v) - log(x->lo)) / (log(x->hi) - log(x->lo));
  else t = (v - x->lo) / (x->hi - x->lo);
  return L + (0.04 + 0.92 * t) * (W - L - R); /* points stay clear of the axes */
}

static double ypos(double ratio) { return T + (1.0 - ratio) * (H - T - B); }

static void series(FILE *f, const struct curve_point *pts, unsigned n, const struct xscale *x, bool tokens,
                   const char *color) {
  /* bounded points by capacity (the sweep may list them in any order) */
  unsigned order[64], m = 0;
  for (unsigned i = 0; i < n && m < 64; i++)
    if (!pts[i].unbounded) order[m++] = i;
  for (unsigned i = 1; i < m; i++)
    for (unsigned j = i; j > 0 && pts[order[j]].capacity < pts[order[j - 1]].capacity; j--) {
      unsigned t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  fprintf(f, "<polyline class=\"%s-line\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
          tokens ? "tokens" : "blocks", color);
  for (unsigned k = 0; k < m; k++) {
    const struct curve_point *p = &pts[order[k]];
    fprintf(f, "%s%.2f,%.2f", k ? " " : "", xpos(x, p->capacity), ypos(tokens ? p->token_ratio : p->cache_ratio));
  }
  fputs("\"/>\n", f);
  for (unsigned k = 0; k < m; k++) {
    const struct curve_point *p = &pts[order[k]];
    double r = tokens ? p->token_ratio : p->cache_ratio;
    char sz[32];
    fprintf(f,
            "<circle class=\"%s\" cx=\"%.2f\" cy=\"%.2f\" r=\"4\" fill=\"%s\" data-capacity=\"%llu\" "
            "data-ratio=\"%.10g\"><title>%s: %.2f%% %s</title></circle>\n",
            tokens ? "tokens" : "blocks", xpos(x, p->capacity), ypos(r), color, (unsigned long long)p->capacity, r,
            cli_fmt_size(p->capacity, sz, sizeof sz), 100 * r, tokens ? "of input tokens" : "of blocks");
  }
}

int curve_svg(FILE *f, const struct curve_point *pts, unsigned n, int knee, const char *title) {
  struct xscale x = {false, 0, 0};
  bool any = false;
  for (unsigned i = 0; i < n; i++) {
    if (pts[i].unbounded) continue;
    double v = (double)pts[i].capacity;
    if (!any || v < x.lo) x.lo = v;
    if (!any || v > x.hi) x.hi = v;
    any = true;
  }
  x.log = any && x.hi > 10 * x.lo;
  if (!x.log && any) x.lo = 0; /* a linear axis starts at 0 */
  const char *blue = "#1f77b4", *orange = "#ff7f0e";
  fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
             "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
             "font-family=\"sans-serif\" font-size=\"12\">\n"
             "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
          W, H, W, H);
  fputs("<text class=\"title\" x=\"", f);
  fprintf(f, "%d\" y=\"24\" font-size=\"14\">Hit ratio against pool capacity: ", L);
  xml_text(f, title);
  fputs("</text>\n", f);
  /* y axis: 0..100% */
  for (int p = 0; p <= 100; p += 10) {
    double y = ypos(p / 100.0);
    fprintf(f, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\" stroke=\"#ddd\"/>\n", L, y, W - R, y);
    fprintf(f, "<text x=\"%d\" y=\"%.2f\" text-anchor=\"end\">%d%%</text>\n", L - 6, y + 4, p);
  }
  fprintf(f, "<text x=\"16\" y=\"%d\" transform=\"rotate(-90 16 %d)\" text-anchor=\"middle\">hit ratio</text>\n",
          (T + H - B) / 2, (T + H - B) / 2);
  /* x axis: a tick at each capacity of the sweep */
  fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
  for (unsigned i = 0; i < n; i++) {
    if (pts[i].unbounded) continue;
    char sz[32];
    double xx = xpos(&x, pts[i].capacity);
    fprintf(f, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"black\"/>\n", xx, H - B, xx, H - B + 5);
    fprintf(f, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"end\" transform=\"rotate(-35 %.2f %d)\">%s</text>\n", xx,
            H - B + 18, xx, H - B + 18, cli_fmt_size(pts[i].capacity, sz, sizeof sz));
  }
  fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">pool capacity%s</text>\n", (L + W - R) / 2, H - 8,
          x.log ? " (log scale)" : "");
  /* the unbounded ratios */
  for (unsigned i = 0; i < n; i++) {
    if (!pts[i].unbounded) continue;
    for (int tk = 0; tk < 2; tk++) {
      double r = tk ? pts[i].token_ratio : pts[i].cache_ratio;
      double y = ypos(r);
      fprintf(f, "<line class=\"unbounded-%s\" x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\" stroke=\"%s\" "
                 "stroke-dasharray=\"6 4\" data-ratio=\"%.10g\"/>\n",
              tk ? "tokens" : "blocks", L, y, W - R, y, tk ? orange : blue, r);
      fprintf(f, "<text x=\"%d\" y=\"%.2f\" fill=\"%s\">unbounded: %.2f%%</text>\n", W - R + 6, y + (tk ? 12 : -2),
              tk ? orange : blue, 100 * r);
    }
    break;
  }
  if (knee >= 0) {
    char sz[32];
    double xx = xpos(&x, pts[knee].capacity);
    fprintf(f, "<line class=\"knee\" x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#2ca02c\" "
               "stroke-dasharray=\"2 3\" data-capacity=\"%llu\"/>\n",
            xx, T, xx, H - B, (unsigned long long)pts[knee].capacity);
    fprintf(f, "<text x=\"%.2f\" y=\"%d\" fill=\"#2ca02c\" text-anchor=\"middle\">95%% of unbounded at %s</text>\n", xx,
            T - 6, cli_fmt_size(pts[knee].capacity, sz, sizeof sz));
  }
  series(f, pts, n, &x, false, blue);
  series(f, pts, n, &x, true, orange);
  /* legend */
  fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/>"
             "<text x=\"%d\" y=\"%d\">cache ratio (blocks)</text>\n",
          W - R + 6, H - B - 40, W - R + 26, H - B - 40, blue, W - R + 30, H - B - 36);
  fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/>"
             "<text x=\"%d\" y=\"%d\">token ratio</text>\n",
          W - R + 6, H - B - 22, W - R + 26, H - B - 22, orange, W - R + 30, H - B - 18);
  fputs("</svg>\n", f);
  fflush(f);
  return ferror(f) ? -EIO : 0;
}

int curve_csv(FILE *f, const struct curve_point *pts, unsigned n) {
  fputs("capacity_bytes,slots,unbounded,cache_ratio,token_ratio,blocks_hit,blocks_total,evictions\n", f);
  for (unsigned i = 0; i < n; i++)
    fprintf(f, "%llu,%llu,%d,%.10g,%.10g,%llu,%llu,%llu\n", (unsigned long long)pts[i].capacity,
            (unsigned long long)pts[i].slots, pts[i].unbounded ? 1 : 0, pts[i].cache_ratio, pts[i].token_ratio,
            (unsigned long long)pts[i].blocks_hit, (unsigned long long)pts[i].blocks_total,
            (unsigned long long)pts[i].evictions);
  fflush(f);
  return ferror(f) ? -EIO : 0;
}
