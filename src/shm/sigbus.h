/* SPDX-License-Identifier: Apache-2.0 */
/* A SIGBUS in an attached pool's mapping, named on stderr (sigbus.c has the
 * design). Internal to the segment layer. */
#ifndef UMBP_SHM_SIGBUS_H
#define UMBP_SHM_SIGBUS_H

struct umbp_pool;

/* Cover p's mapping: the first call of the process installs the handler
 * (unless UMBP_NO_SIGBUS_HANDLER is set). Call once p is complete (its
 * mapping, file and index file final). A full table leaves p uncovered. */
void umbp_sigbus_watch(const struct umbp_pool *p);
/* Stop covering p's mapping: before it is unmapped. Accepts an uncovered p. */
void umbp_sigbus_forget(const struct umbp_pool *p);

#endif
