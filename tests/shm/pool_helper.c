/* SPDX-License-Identifier: Apache-2.0 */
/* Exec'd by the segment tests so each process maps the pool at its own address.
 *   pool_helper rw NAME          attach, read slot 0's pattern, write slot 1's, print, exit
 *   pool_helper hold NAME        attach, print "ready", sleep until killed
 *   pool_helper attach-as UID NAME  drop to UID, try to attach, print the return code
 *   pool_helper sleep            print our pid and sleep (pid-reuse test)
 *   pool_helper create-stall NAME  create a 16 MiB pool and stop while pre-faulting it
 *                                (before the magic): print "prefaulting", sleep until killed
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "umbp/index.h"
#include "umbp/pool.h"

static void stall_progress(void *arg, const char *what, uint64_t done, uint64_t total) {
  (void)arg;
  (void)done;
  (void)total;
  printf("%s\n", what);
  fflush(stdout);
  for (;;) pause();
}

int main(int argc, char **argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a test that failed before killing us */
  if (argc >= 3 && !strcmp(argv[1], "create-stall")) {
    umbp_pool_params pp;
    umbp_pool_params_init(&pp);
    pp.capacity = 16 << 20;
    pp.slot_size = 64 << 10;
    pp.progress = stall_progress;
    umbp_pool *p;
    int rc = umbp_pool_create(argv[2], &pp, &p);
    printf("create %d %s\n", rc, umbp_last_error()); /* not reached when it stalls */
    return 1;
  }
  if (argc >= 3 && !strcmp(argv[1], "rw")) {
    umbp_pool *p;
    int rc = umbp_pool_attach(argv[2], NULL, &p);
    if (rc) {
      printf("attach %d %s\n", rc, umbp_last_error());
      return 1;
    }
    unsigned char *s0 = umbp_slot_ptr(p, 0), *s1 = umbp_slot_ptr(p, 1);
    int ok = 1;
    for (int i = 0; i < 4096; i++) ok &= s0[i] == (unsigned char)(i * 7 + 1);
    for (int i = 0; i < 4096; i++) s1[i] = (unsigned char)(i * 13 + 5);
    printf("ok %d base %p slot %d\n", ok, (void *)s0, umbp_pool_proc_slot(p));
    fflush(stdout);
    umbp_pool_detach(p);
    return ok ? 0 : 2;
  }
  if (argc >= 3 && !strcmp(argv[1], "hold")) {
    umbp_pool *p;
    umbp_attach_opts o;
    umbp_attach_opts_init(&o);
    o.role = UMBP_ROLE_WORKER;
    o.rank = 3;
    int rc = umbp_pool_attach(argv[2], &o, &p);
    if (rc) {
      printf("attach %d %s\n", rc, umbp_last_error());
      return 1;
    }
    printf("ready %d\n", umbp_pool_proc_slot(p));
    fflush(stdout);
    for (;;) pause();
  }
  if (argc >= 4 && !strcmp(argv[1], "attach-as")) {
    uid_t uid = (uid_t)atoi(argv[2]);
    if (setgid(uid) != 0 || setuid(uid) != 0) {
      printf("setuid-failed\n");
      return 3;
    }
    umbp_pool *p;
    umbp_attach_opts o;
    umbp_attach_opts_init(&o);
    o.read_only = argc >= 5 && !strcmp(argv[4], "ro");
    int rc = umbp_pool_attach(argv[3], &o, &p);
    printf("%d\n", rc);
    if (!rc) umbp_pool_detach(p);
    return 0;
  }
  if (argc >= 2 && !strcmp(argv[1], "sleep")) {
    printf("%d\n", (int)getpid());
    fflush(stdout);
    for (;;) pause();
  }
  fprintf(stderr, "usage: pool_helper rw|hold|attach-as|sleep ...\n");
  return 2;
}
