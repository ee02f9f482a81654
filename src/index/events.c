/* SPDX-License-Identifier: Apache-2.0 */
/*
 * events.c — the event ring: a removed event for each eviction or removal,
 * and a stored event for each publish once umbp_events_enable_stored() asks
 * for them.
 *
 * Design note. Removals and evictions (evict.c) and publishes (reserve.c)
 * put their events into one ring in the segment, the key in the segment's
 * layout; a full ring drops its oldest event and counts the drop
 * (umbp_events_dropped()). A remover emits while its slot is still
 * EVICTING, so that the reaper of a remover killed before its RETIRED store
 * emits it instead (evict.c, reap.c) and no removal goes unannounced.
 * Draining converts each key back to the caller's layout.
 */
#include "index/index_inline.h"

/* Put an event of type `type` for key k into the event ring (overwriting the
 * oldest when full). */
void umbp_ix_emit(struct umbp_index *ix, int type, const struct umbp_key_shm *k) {
  struct umbp_event_shm ev;
  memset(&ev, 0, sizeof ev);
  ev.type = (uint8_t)type;
  ev.key = *k;
  umbp_ring_enqueue_overwrite_g(ix->events, &ix->ev_geo, &ev, ix->p->owner_id);
}

/* A key in the segment's layout, back in the caller's (umbp_key). */
static void key_from_shm(const struct umbp_key_shm *s, umbp_key *k) {
  memset(k, 0, sizeof *k);
  k->ns = s->ns;
  k->tp_rank = s->tp;
  k->pcp_rank = s->pcp;
  k->dcp_rank = s->dcp;
  k->pp_rank = s->pp;
  k->group = s->group;
  k->hash_len = s->hash_len > UMBP_KEY_HASH_MAX ? UMBP_KEY_HASH_MAX : s->hash_len;
  memcpy(k->hash, s->hash, k->hash_len);
}

UMBP_API int umbp_events_drain(umbp_pool *p, umbp_event *out, unsigned max) {
  if (!p || (!out && max)) return umbp_fail(-EINVAL, "umbp_events_drain: pool, and out for max = %u, are required", max);
  if (p->forked) return umbp_pool_forked_fail(p);
  if (p->read_only || !p->index) return umbp_fail(-EROFS, "draining events needs a read-write attachment");
  unsigned n = 0;
  while (n < max) {
    struct umbp_event_shm ev[16];
    unsigned want = max - n < 16 ? max - n : 16;
    unsigned got = umbp_ring_dequeue_burst_g(p->index->events, &p->index->ev_geo, ev, want, p->owner_id);
    for (unsigned i = 0; i < got; i++) {
      out[n + i].type = ev[i].type;
      key_from_shm(&ev[i].key, &out[n + i].key);
    }
    n += got;
    if (got < want) break;
  }
  return (int)n;
}

UMBP_API uint64_t umbp_events_dropped(umbp_pool *p) {
  if (!p) return 0;
  return umbp_ring_dropped(umbp_pool_region(p, UMBP_REG_EVENTS));
}

UMBP_API void umbp_events_enable_stored(umbp_pool *p, bool on) {
  if (p && p->index) atomic_store(&p->index->ev_stored, on);
}
