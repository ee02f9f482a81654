/* SPDX-License-Identifier: Apache-2.0 */
/*
 * modules.c — the modules that keep state in a pool segment, in the order the
 * segment layer calls their hooks (src/shm/module.h). Like abi.c, it sits
 * above every module because it names them.
 *
 * The block index is the only one. The data path owns no region of the
 * segment (the slot bytes belong to the partitions the segment layer lays
 * out), keeps no state per attachment (its engines are created and destroyed
 * by their callers) and keeps its CUDA IPC table in a file of its own with
 * its own version header (dp_ipc.c), so it has nothing to register. A module
 * that comes to keep state in the segment adds its struct umbp_shm_module
 * here; the fingerprint then changes, and older builds refuse its pools.
 */
#include "index/index_internal.h"
#include "shm/module.h"

const struct umbp_shm_module *const umbp_shm_modules[] = {
    &umbp_index_module,
};
const unsigned umbp_shm_n_modules = sizeof umbp_shm_modules / sizeof umbp_shm_modules[0];
