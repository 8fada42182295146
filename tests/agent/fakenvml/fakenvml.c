/*
 * A fake libnvidia-ml.so.1 for tests: the NVML C ABI the gpulens agent uses, answered from a small
 * text description instead of a GPU, so the real pynvml (ctypes structs, error codes, symbol
 * lookups) and producers/agent/nvml.py run exactly as they do on a node.
 *
 * The description is read at nvmlInit from the file named by FAKE_NVML_CONFIG; one record a line,
 * fields "key=value" separated by ';' (values may contain spaces):
 *   driver=535.54.03;cuda=12020
 *   gpu=GPU-...;name=NVIDIA A100-SXM4-80GB;mem_total=..;mem_used=..;mem_reserved=..;
 *       util_gpu=..;util_mem=..;power_mw=..;temp_c=..;sm_mhz=..;mem_mhz=..;pcie_tx_kbs=..;pcie_rx_kbs=..;
 *       nvlink_tx_kib=..;nvlink_rx_kib=..;mig=0|1|na;unsupported=power,temperature,...;
 *       lost_after=N (every call answers GPU_IS_LOST once the handle was opened N times)
 *   mig=MIG-...;parent=GPU-...;name=... MIG 1g.10gb;gi=1;ci=0;mem_total=..;mem_used=..;
 *       start=N|denied (the GPU instance's placement start; denied: opening GPU instances answers
 *       NO_PERMISSION, as for an unprivileged caller; absent: NOT_SUPPORTED)
 *   proc=PID;device=GPU-...|MIG-...;mem=BYTES|na;sm=PCT
 *   xid=79;device=GPU-...;after=N (queued when the GPU's handle is opened the N-th time)
 *   init_error=CODE (nvmlInit fails with this NVML return code)
 *
 * mem_used is what processes use (nvidia-smi's "Used"); mem_reserved what the driver keeps for
 * itself (nvidia-smi's "Reserved"): the unversioned nvmlDeviceGetMemoryInfo counts both as used,
 * as a real driver does (0.6 GiB on an idle H200 with 580.159.04), nvmlDeviceGetMemoryInfo_v2 apart.
 *
 * Driver generations differ in the symbols they export; the build leaves some out:
 *   -DMEM_V2       nvmlDeviceGetMemoryInfo_v2 (R510+)
 *   -DPROC_V2      nvmlDeviceGetComputeRunningProcesses_v2 (R510+)
 *   -DPROC_V3      nvmlDeviceGetComputeRunningProcesses_v3 (535), with the v2 struct ...
 *   -DPROC_V3_CC   ... or with the 32-byte struct of 535.43-535.86 (usedGpuCcProtectedMemory)
 *   -DPROC_DETAIL  nvmlDeviceGetRunningProcessDetailList (R550+), instead of _v3
 * The unversioned nvmlDeviceGetComputeRunningProcesses (v1 struct) is always there.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

enum {
    OK = 0, ERR_UNINITIALIZED = 1, ERR_INVALID_ARGUMENT = 2, ERR_NOT_SUPPORTED = 3, ERR_NO_PERMISSION = 4,
    ERR_NOT_FOUND = 6,
    ERR_INSUFFICIENT_SIZE = 7, ERR_TIMEOUT = 10, ERR_GPU_IS_LOST = 15, ERR_UNKNOWN = 999
};

#define MAX_DEVICES 64
#define MAX_PROCS 256
#define MAX_XIDS 64
#define NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL
#define NO_INSTANCE 0xFFFFFFFFu

typedef struct device {
    char uuid[96];
    char name[96];
    int is_mig;
    int parent;  /* index into devices[] of the physical GPU (MIG devices) */
    unsigned gi, ci;
    int start;  /* placement start; -1 not supported, -2 no permission */
    unsigned long long mem_total, mem_used, mem_reserved;
    unsigned util_gpu, util_mem, power_mw, temp_c, sm_mhz, mem_mhz, pcie_tx, pcie_rx;
    unsigned long long nvlink_tx, nvlink_rx;
    int mig;  /* 1 enabled, 0 disabled, -1 not supported */
    char unsupported[256];
    int lost_after;  /* 0 = never */
    int opens;
} device_t;

typedef struct { unsigned pid; int device; unsigned long long mem; unsigned sm; } proc_t;
typedef struct { unsigned long long xid; int device; int after; int queued; } xid_t;

static device_t devices[MAX_DEVICES];
static int n_devices, n_gpus;
static int gpu_order[MAX_DEVICES];
static proc_t procs[MAX_PROCS];
static int n_procs;
static xid_t xids[MAX_XIDS];
static int n_xids;
static int pending[MAX_XIDS];
static int n_pending;
static char driver[64] = "535.54.03";
static int cuda_version = 12020;
static int init_error;
static int initialised;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static const char *field(const char *line, const char *key, char *out, size_t size) {
    size_t klen = strlen(key);
    const char *p = line;
    while (p && *p) {
        while (*p == ' ' || *p == ';') p++;
        if (strncmp(p, key, klen) == 0 && p[klen] == '=') {
            const char *v = p + klen + 1;
            size_t n = strcspn(v, ";\n");
            if (n >= size) n = size - 1;
            memcpy(out, v, n);
            out[n] = 0;
            return out;
        }
        p = strchr(p, ';');
    }
    return NULL;
}

static unsigned long long num(const char *line, const char *key, unsigned long long fallback) {
    char buf[64];
    if (!field(line, key, buf, sizeof buf)) return fallback;
    if (strcmp(buf, "na") == 0) return NOT_AVAILABLE;
    return strtoull(buf, NULL, 10);
}

static int find_device(const char *uuid) {
    for (int i = 0; i < n_devices; i++)
        if (strcmp(devices[i].uuid, uuid) == 0) return i;
    return -1;
}

static int load(void) {
    const char *path = getenv("FAKE_NVML_CONFIG");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return ERR_UNKNOWN;
    n_devices = n_gpus = n_procs = n_xids = n_pending = 0;
    init_error = 0;
    char line[1024], buf[256];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        if (field(line, "driver", buf, sizeof buf)) {
            snprintf(driver, sizeof driver, "%s", buf);
            cuda_version = (int)num(line, "cuda", 12020);
        } else if (field(line, "init_error", buf, sizeof buf)) {
            init_error = atoi(buf);
        } else if ((field(line, "gpu", buf, sizeof buf) || field(line, "mig", buf, sizeof buf))
                   && n_devices < MAX_DEVICES) {
            device_t *d = &devices[n_devices];
            memset(d, 0, sizeof *d);
            d->is_mig = strncmp(line, "mig=", 4) == 0;
            snprintf(d->uuid, sizeof d->uuid, "%s", buf);
            if (field(line, "name", buf, sizeof buf)) snprintf(d->name, sizeof d->name, "%s", buf);
            d->mem_total = num(line, "mem_total", 0);
            d->mem_used = num(line, "mem_used", 0);
            d->mem_reserved = num(line, "mem_reserved", 0);
            d->util_gpu = (unsigned)num(line, "util_gpu", 0);
            d->util_mem = (unsigned)num(line, "util_mem", 0);
            d->power_mw = (unsigned)num(line, "power_mw", 0);
            d->temp_c = (unsigned)num(line, "temp_c", 0);
            d->sm_mhz = (unsigned)num(line, "sm_mhz", 0);
            d->mem_mhz = (unsigned)num(line, "mem_mhz", 0);
            d->pcie_tx = (unsigned)num(line, "pcie_tx_kbs", 0);
            d->pcie_rx = (unsigned)num(line, "pcie_rx_kbs", 0);
            d->nvlink_tx = num(line, "nvlink_tx_kib", 0);
            d->nvlink_rx = num(line, "nvlink_rx_kib", 0);
            d->lost_after = (int)num(line, "lost_after", 0);
            d->mig = 0;
            if (field(line, "mig_mode", buf, sizeof buf)) d->mig = strcmp(buf, "na") == 0 ? -1 : atoi(buf);
            if (field(line, "unsupported", buf, sizeof buf)) snprintf(d->unsupported, sizeof d->unsupported, ",%s,", buf);
            if (d->is_mig) {
                d->gi = (unsigned)num(line, "gi", 0);
                d->ci = (unsigned)num(line, "ci", 0);
                d->start = -1;
                if (field(line, "start", buf, sizeof buf)) d->start = strcmp(buf, "denied") == 0 ? -2 : atoi(buf);
                d->parent = field(line, "parent", buf, sizeof buf) ? find_device(buf) : -1;
                if (d->parent < 0) { fclose(f); return ERR_UNKNOWN; }
            } else {
                gpu_order[n_gpus++] = n_devices;
            }
            n_devices++;
        } else if (field(line, "proc", buf, sizeof buf) && n_procs < MAX_PROCS) {
            proc_t *p = &procs[n_procs++];
            p->pid = (unsigned)strtoul(buf, NULL, 10);
            p->device = field(line, "device", buf, sizeof buf) ? find_device(buf) : -1;
            p->mem = num(line, "mem", 0);
            p->sm = (unsigned)num(line, "sm", 0);
        } else if (field(line, "xid", buf, sizeof buf) && n_xids < MAX_XIDS) {
            xid_t *x = &xids[n_xids++];
            x->xid = strtoull(buf, NULL, 10);
            x->device = field(line, "device", buf, sizeof buf) ? find_device(buf) : -1;
            x->after = (int)num(line, "after", 1);
            x->queued = 0;
        }
    }
    fclose(f);
    return OK;
}

/* ------------------------------------------------------------------ helpers */

static int index_of(const void *handle) {
    const device_t *d = handle;
    if (d < devices || d >= devices + n_devices) return -1;
    return (int)(d - devices);
}

static int unsupported(const device_t *d, const char *what) {
    char key[64];
    snprintf(key, sizeof key, ",%s,", what);
    return strstr(d->unsupported, key) != NULL;
}

static int lost(const device_t *d) {
    const device_t *gpu = d->is_mig ? &devices[d->parent] : d;
    return gpu->lost_after > 0 && gpu->opens > gpu->lost_after;
}

/* check a handle and the device's state; NULL fills *ret */
static device_t *dev(void *handle, int *ret) {
    if (!initialised) { *ret = ERR_UNINITIALIZED; return NULL; }
    int i = index_of(handle);
    if (i < 0) { *ret = ERR_INVALID_ARGUMENT; return NULL; }
    if (lost(&devices[i])) { *ret = ERR_GPU_IS_LOST; return NULL; }
    *ret = OK;
    return &devices[i];
}

#define DEVICE(handle, feature)                                      \
    int ret_;                                                        \
    device_t *d = dev(handle, &ret_);                                \
    if (!d) return ret_;                                             \
    if ((feature) && unsupported(d, (feature))) return ERR_NOT_SUPPORTED;

static int copy_string(char *out, unsigned size, const char *value) {
    if (!out) return ERR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > size) return ERR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return OK;
}

/* ------------------------------------------------------------------ lifecycle */

EXPORT int nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    int ret = initialised ? OK : load();
    if (ret == OK && init_error) ret = init_error;
    if (ret == OK) initialised++;
    pthread_mutex_unlock(&lock);
    return ret;
}

EXPORT int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT int nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT int nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    int ret = initialised ? OK : ERR_UNINITIALIZED;
    if (initialised) initialised--;
    pthread_mutex_unlock(&lock);
    return ret;
}

EXPORT const char *nvmlErrorString(int result) {
    switch (result) {
    case OK: return "Success";
    case ERR_UNINITIALIZED: return "Uninitialized";
    case ERR_INVALID_ARGUMENT: return "Invalid Argument";
    case ERR_NOT_SUPPORTED: return "Not Supported";
    case ERR_NOT_FOUND: return "Not Found";
    case ERR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case ERR_TIMEOUT: return "Timeout";
    case ERR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

/* ------------------------------------------------------------------ system */

EXPORT int nvmlSystemGetDriverVersion(char *version, unsigned size) {
    if (!initialised) return ERR_UNINITIALIZED;
    return copy_string(version, size, driver);
}

EXPORT int nvmlSystemGetCudaDriverVersion(int *version) {
    if (!version) return ERR_INVALID_ARGUMENT;
    *version = cuda_version;
    return OK;
}

EXPORT int nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

EXPORT int nvmlDeviceGetCount_v2(unsigned *count) {
    if (!initialised) return ERR_UNINITIALIZED;
    *count = (unsigned)n_gpus;
    return OK;
}

EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **device) {
    if (!initialised) return ERR_UNINITIALIZED;
    if (index >= (unsigned)n_gpus) return ERR_INVALID_ARGUMENT;
    device_t *d = &devices[gpu_order[index]];
    pthread_mutex_lock(&lock);
    d->opens++;
    for (int i = 0; i < n_xids; i++) {
        if (!xids[i].queued && xids[i].device == gpu_order[index] && d->opens >= xids[i].after) {
            xids[i].queued = 1;
            pending[n_pending++] = i;
        }
    }
    pthread_mutex_unlock(&lock);
    *device = d;
    return OK;
}

/* ------------------------------------------------------------------ per device */

EXPORT int nvmlDeviceGetUUID(void *handle, char *uuid, unsigned size) {
    DEVICE(handle, NULL);
    return copy_string(uuid, size, d->uuid);
}

EXPORT int nvmlDeviceGetName(void *handle, char *name, unsigned size) {
    DEVICE(handle, "name");
    return copy_string(name, size, d->name);
}

typedef struct { unsigned long long total, free, used; } memory_t;

EXPORT int nvmlDeviceGetMemoryInfo(void *handle, memory_t *memory) {
    DEVICE(handle, "memory");
    memory->total = d->mem_total;
    memory->used = d->mem_used + d->mem_reserved;
    memory->free = d->mem_total - memory->used;
    return OK;
}

#ifdef MEM_V2
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } memory_v2_t;

EXPORT int nvmlDeviceGetMemoryInfo_v2(void *handle, memory_v2_t *memory) {
    DEVICE(handle, "memory");
    if (unsupported(d, "memory_v2")) return ERR_NOT_SUPPORTED;
    if (memory->version != 0x02000028u || unsupported(d, "memory_v2_version"))
        return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    memory->total = d->mem_total;
    memory->reserved = d->mem_reserved;
    memory->used = d->mem_used;
    memory->free = d->mem_total - d->mem_used - d->mem_reserved;
    return OK;
}
#endif

typedef struct { unsigned gpu, memory; } utilization_t;

EXPORT int nvmlDeviceGetUtilizationRates(void *handle, utilization_t *util) {
    DEVICE(handle, "utilization");
    if (d->is_mig) return ERR_NOT_SUPPORTED;  /* as on real MIG devices */
    util->gpu = d->util_gpu;
    util->memory = d->util_mem;
    return OK;
}

EXPORT int nvmlDeviceGetPowerUsage(void *handle, unsigned *mw) {
    DEVICE(handle, "power");
    *mw = d->power_mw;
    return OK;
}

EXPORT int nvmlDeviceGetTemperature(void *handle, int sensor, unsigned *temp) {
    DEVICE(handle, "temperature");
    if (sensor != 0) return ERR_INVALID_ARGUMENT;
    *temp = d->temp_c;
    return OK;
}

EXPORT int nvmlDeviceGetClockInfo(void *handle, int type, unsigned *mhz) {
    DEVICE(handle, "clock");
    if (type == 1) *mhz = d->sm_mhz;
    else if (type == 2) *mhz = d->mem_mhz;
    else return ERR_INVALID_ARGUMENT;
    return OK;
}

EXPORT int nvmlDeviceGetPcieThroughput(void *handle, int counter, unsigned *kbs) {
    DEVICE(handle, "pcie");
    if (counter == 0) *kbs = d->pcie_tx;
    else if (counter == 1) *kbs = d->pcie_rx;
    else return ERR_INVALID_ARGUMENT;
    return OK;
}

typedef struct {
    uint32_t fieldId, scopeId;
    int64_t timestamp, latencyUsec;
    uint32_t valueType, nvmlReturn;
    union { double d; unsigned u; unsigned long ul; unsigned long long ull; long long sll; } value;
} field_value_t;

EXPORT int nvmlDeviceGetFieldValues(void *handle, int count, field_value_t *values) {
    DEVICE(handle, NULL);
    for (int i = 0; i < count; i++) {
        field_value_t *v = &values[i];
        v->valueType = 3; /* unsigned long long */
        v->timestamp = (int64_t)time(NULL) * 1000000;
        if (unsupported(d, "nvlink") || (v->fieldId != 138 && v->fieldId != 139)) {
            v->nvmlReturn = ERR_NOT_SUPPORTED;
            continue;
        }
        v->nvmlReturn = OK;
        v->value.ull = v->fieldId == 138 ? d->nvlink_tx : d->nvlink_rx;
    }
    return OK;
}

/* ------------------------------------------------------------------ processes */

typedef struct { unsigned pid; unsigned long long usedGpuMemory; } proc_v1_t;
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId; } proc_v2_t;
typedef struct {
    unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} proc_v3_t;
typedef struct {
    unsigned version, mode, numProcArrayEntries;
    proc_v3_t *procArray;  /* nvmlProcessDetail_v1_t has the same layout as the 535.43 v3 struct */
} proc_detail_list_t;

/* processes of one device: a physical GPU in MIG mode lists those of its MIG devices */
static int collect(int index, int *out) {
    int n = 0;
    for (int i = 0; i < n_procs; i++) {
        int on = procs[i].device;
        if (on == index || (on >= 0 && devices[on].is_mig && devices[on].parent == index)) out[n++] = i;
    }
    return n;
}

static void fill(const device_t *d, const proc_t *p, unsigned *pid, unsigned long long *mem, unsigned *gi, unsigned *ci) {
    const device_t *on = &devices[p->device];
    *pid = p->pid;
    *mem = p->mem;
    if (gi) *gi = on->is_mig ? on->gi : NO_INSTANCE;
    if (ci) *ci = on->is_mig ? on->ci : NO_INSTANCE;
    (void)d;
}

#define LIST_PROCESSES(struct_t, with_ids)                                           \
    DEVICE(handle, "processes");                                                     \
    int found[MAX_PROCS];                                                            \
    int n = collect((int)(d - devices), found);                                      \
    if (!count) return ERR_INVALID_ARGUMENT;                                         \
    if (n == 0) { *count = 0; return OK; }                                           \
    if (!infos || *count < (unsigned)n) { *count = (unsigned)n; return ERR_INSUFFICIENT_SIZE; } \
    for (int i = 0; i < n; i++) {                                                    \
        struct_t *o = &((struct_t *)infos)[i];                                       \
        memset(o, 0, sizeof *o);                                                     \
        WITH_IDS_##with_ids                                                          \
    }                                                                                \
    *count = (unsigned)n;                                                            \
    return OK;

#define WITH_IDS_0 fill(d, &procs[found[i]], &o->pid, &o->usedGpuMemory, NULL, NULL);
#define WITH_IDS_1 fill(d, &procs[found[i]], &o->pid, &o->usedGpuMemory, &o->gpuInstanceId, &o->computeInstanceId);

EXPORT int nvmlDeviceGetComputeRunningProcesses(void *handle, unsigned *count, void *infos) {
    LIST_PROCESSES(proc_v1_t, 0)
}

#ifdef PROC_V2
EXPORT int nvmlDeviceGetComputeRunningProcesses_v2(void *handle, unsigned *count, void *infos) {
    LIST_PROCESSES(proc_v2_t, 1)
}
#endif

#ifdef PROC_V3
EXPORT int nvmlDeviceGetComputeRunningProcesses_v3(void *handle, unsigned *count, void *infos) {
#ifdef PROC_V3_CC
    LIST_PROCESSES(proc_v3_t, 1)
#else
    LIST_PROCESSES(proc_v2_t, 1)
#endif
}
#endif

#ifdef PROC_DETAIL
EXPORT int nvmlDeviceGetRunningProcessDetailList(void *handle, proc_detail_list_t *list) {
    if (!list) return ERR_INVALID_ARGUMENT;
    if (list->version != 0x1000018u) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    if (list->mode != 0) return ERR_NOT_SUPPORTED; /* compute processes only */
    unsigned *count = &list->numProcArrayEntries;
    void *infos = list->procArray;
    LIST_PROCESSES(proc_v3_t, 1)
}
#endif

typedef struct {
    unsigned pid; unsigned long long timeStamp; unsigned smUtil, memUtil, encUtil, decUtil;
} proc_util_t;

static unsigned long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

EXPORT int nvmlDeviceGetProcessUtilization(void *handle, proc_util_t *samples, unsigned *count,
                                           unsigned long long last_seen) {
    DEVICE(handle, "process_utilization");
    if (d->is_mig) return ERR_NOT_SUPPORTED;
    int found[MAX_PROCS];
    int n = collect((int)(d - devices), found);
    unsigned long long stamp = now_us();
    if (n == 0 || stamp <= last_seen) return ERR_NOT_FOUND;
    if (!samples || *count < (unsigned)n) { *count = (unsigned)n; return ERR_INSUFFICIENT_SIZE; }
    for (int i = 0; i < n; i++) {
        memset(&samples[i], 0, sizeof samples[i]);
        samples[i].pid = procs[found[i]].pid;
        samples[i].timeStamp = stamp;
        samples[i].smUtil = procs[found[i]].sm;
    }
    *count = (unsigned)n;
    return OK;
}

/* ------------------------------------------------------------------ MIG */

EXPORT int nvmlDeviceGetMigMode(void *handle, unsigned *current, unsigned *pending_mode) {
    DEVICE(handle, NULL);
    if (d->is_mig || d->mig < 0) return ERR_NOT_SUPPORTED;
    *current = *pending_mode = (unsigned)d->mig;
    return OK;
}

EXPORT int nvmlDeviceGetMaxMigDeviceCount(void *handle, unsigned *count) {
    DEVICE(handle, NULL);
    if (d->is_mig || d->mig < 0) return ERR_NOT_SUPPORTED;
    *count = 7;
    return OK;
}

EXPORT int nvmlDeviceGetMigDeviceHandleByIndex(void *handle, unsigned index, void **mig) {
    DEVICE(handle, NULL);
    if (d->mig != 1) return ERR_INVALID_ARGUMENT;
    unsigned seen = 0;
    for (int i = 0; i < n_devices; i++) {
        if (devices[i].is_mig && devices[i].parent == (int)(d - devices)) {
            if (seen++ == index) { *mig = &devices[i]; return OK; }
        }
    }
    return ERR_NOT_FOUND;
}

EXPORT int nvmlDeviceGetGpuInstanceId(void *handle, unsigned *id) {
    DEVICE(handle, NULL);
    if (!d->is_mig) return ERR_INVALID_ARGUMENT;
    *id = d->gi;
    return OK;
}

EXPORT int nvmlDeviceGetComputeInstanceId(void *handle, unsigned *id) {
    DEVICE(handle, NULL);
    if (!d->is_mig) return ERR_INVALID_ARGUMENT;
    *id = d->ci;
    return OK;
}

EXPORT int nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *handle, void **parent) {
    DEVICE(handle, NULL);
    if (!d->is_mig) return ERR_INVALID_ARGUMENT;
    *parent = &devices[d->parent];
    return OK;
}

/* a GPU instance handle is its MIG device's record (one compute instance per GPU instance here) */
EXPORT int nvmlDeviceGetGpuInstanceById(void *handle, unsigned id, void **instance) {
    DEVICE(handle, NULL);
    if (d->is_mig) return ERR_INVALID_ARGUMENT;
    for (int i = 0; i < n_devices; i++) {
        device_t *m = &devices[i];
        if (m->is_mig && m->parent == (int)(d - devices) && m->gi == id) {
            if (m->start == -2) return ERR_NO_PERMISSION;
            if (m->start == -1) return ERR_NOT_SUPPORTED;
            *instance = m;
            return OK;
        }
    }
    return ERR_NOT_FOUND;
}

typedef struct { void *device; unsigned id, profile_id; struct { unsigned start, size; } placement; } gi_info_t;

EXPORT int nvmlGpuInstanceGetInfo(void *instance, gi_info_t *info) {
    DEVICE(instance, NULL);
    if (!d->is_mig || !info) return ERR_INVALID_ARGUMENT;
    info->device = &devices[d->parent];
    info->id = d->gi;
    info->profile_id = 0;
    info->placement.start = (unsigned)d->start;
    info->placement.size = 0;
    return OK;
}

/* ------------------------------------------------------------------ events (XID) */

typedef struct {
    void *device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} event_data_t;

static int event_set_token;

EXPORT int nvmlEventSetCreate(void **set) {
    if (!initialised) return ERR_UNINITIALIZED;
    *set = &event_set_token;
    return OK;
}

EXPORT int nvmlDeviceRegisterEvents(void *handle, unsigned long long types, void *set) {
    DEVICE(handle, "events");
    if (set != &event_set_token || !(types & 0x8ULL)) return ERR_INVALID_ARGUMENT;
    return OK;
}

EXPORT int nvmlEventSetFree(void *set) {
    return set == &event_set_token ? OK : ERR_INVALID_ARGUMENT;
}

EXPORT int nvmlEventSetWait_v2(void *set, event_data_t *data, unsigned timeout_ms) {
    if (set != &event_set_token) return ERR_INVALID_ARGUMENT;
    for (unsigned waited = 0;; waited += 10) {
        pthread_mutex_lock(&lock);
        if (!initialised) { pthread_mutex_unlock(&lock); return ERR_UNINITIALIZED; }
        if (n_pending > 0) {
            xid_t *x = &xids[pending[0]];
            memmove(pending, pending + 1, sizeof(int) * (size_t)(--n_pending));
            data->device = &devices[x->device];
            data->eventType = 0x8ULL;
            data->eventData = x->xid;
            data->gpuInstanceId = NO_INSTANCE;
            data->computeInstanceId = NO_INSTANCE;
            pthread_mutex_unlock(&lock);
            return OK;
        }
        pthread_mutex_unlock(&lock);
        if (waited >= timeout_ms) return ERR_TIMEOUT;
        usleep(10000);
    }
}
