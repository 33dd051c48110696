/*
 * A stand-in libnvidia-ml.so.1 for gswarm's tests: the NVML calls that nvitop makes for what gswarm samples,
 * answered from a JSON file instead of a GPU. Written against the signatures and struct layouts of NVIDIA's
 * public nvml.h; it includes no NVIDIA header and no third-party code.
 *
 * Build:  cc -shared -fPIC -O2 -pthread -o <dir>/libnvidia-ml.so.1 mock_nvml.c   (tests/harness/nvml_mock: build_library)
 * Use:    LD_LIBRARY_PATH=<dir> GSWARM_MOCK_NVML_CONFIG=<file.json> <program that loads libnvidia-ml.so.1>
 *
 * The file is stat()ed on every call and parsed again only when its inode, size or mtime changed, so a test can
 * rewrite it (atomically: write a temporary file, then rename) while the process runs. A file that fails to parse
 * is reported once on stderr and the last good one stays in force. Without a readable file nvmlInit fails with
 * NVML_ERROR_DRIVER_NOT_LOADED.
 *
 * Schema (unknown keys are refused, so a misspelt key cannot go unnoticed; numbers are non-negative integers):
 *
 * {
 *   "init_error": null | "DRIVER_NOT_LOADED" | "NO_PERMISSION" | ... | <code>,  nvmlInit* fails with it (default null)
 *   "driver_version": "550.54.15",          nvmlSystemGetDriverVersion
 *   "nvml_version": "12.550.54.15",         nvmlSystemGetNVMLVersion
 *   "cuda_driver_version": 12040,           nvmlSystemGetCudaDriverVersion(_v2)
 *   "devices": [                            index = position in this list (at most 64)
 *     {
 *       "name": "NVIDIA H100 80GB HBM3",
 *       "uuid": "GPU-...",                  default GPU-00000000-0000-0000-0000-<index as 12 digits>
 *       "memory_total_bytes": 85899345920,  nvmlDeviceGetMemoryInfo(_v2); free = total - reserved - used
 *       "memory_used_bytes": 1073741824,
 *       "memory_reserved_bytes": 0,
 *       "utilization_gpu_percent": 42,      nvmlDeviceGetUtilizationRates
 *       "utilization_memory_percent": 17,
 *       "encoder_utilization_percent": 0,   nvmlDeviceGetEncoderUtilization
 *       "decoder_utilization_percent": 0,   nvmlDeviceGetDecoderUtilization
 *       "temperature_c": 35,                nvmlDeviceGetTemperature(V), GPU sensor
 *       "power_usage_mw": 123456,           nvmlDeviceGetPowerUsage
 *       "power_limit_mw": 700000,           nvmlDeviceGetPowerManagementLimit
 *       "graphics_clock_mhz": 1980,         nvmlDeviceGetClockInfo and nvmlDeviceGetMaxClockInfo, per clock type
 *       "sm_clock_mhz": 1980,
 *       "memory_clock_mhz": 2619,
 *       "video_clock_mhz": 1545,
 *       "pcie_rx_kib_per_s": 1000,          nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_RX_BYTES): host -> GPU
 *       "pcie_tx_kib_per_s": 2000,          nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX_BYTES): GPU -> host
 *       "nvlink": [                         one entry per link (at most 36): NVML_FI_DEV_NVLINK_LINK_COUNT,
 *         {"active": true,                  nvmlDeviceGetNvLinkState,
 *          "rx_kib_per_s": 3000,            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX/TX: KiB counters that grow at
 *          "tx_kib_per_s": 4000}            these rates while the link is active, stamped in microseconds
 *       ],
 *       "processes": [                      nvmlDeviceGet{Compute,Graphics}RunningProcesses(_v2,_v3), at most 64
 *         {"pid": 1234,
 *          "used_gpu_memory_bytes": 1048576 | null,   null: NVML_VALUE_NOT_AVAILABLE, as under MIG or WDDM
 *          "type": "compute" | "graphics"}            default compute
 *       ],
 *       "not_supported": ["power_usage", ...]   these queries answer NVML_ERROR_NOT_SUPPORTED: memory,
 *                                               utilization, encoder_utilization, decoder_utilization, temperature,
 *                                               power_usage, power_limit, graphics_clock, sm_clock, memory_clock,
 *                                               video_clock, pcie_rx, pcie_tx, nvlink, processes
 *     }
 *   ]
 * }
 *
 * A missing number reads as 0. nvmlDeviceGetProcessUtilization answers NVML_ERROR_NOT_FOUND (no samples).
 */

#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- nvml.h types, as NVIDIA publishes them ---- */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct nvmlDevice_st {
    unsigned int index;
} *nvmlDevice_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int version;
    int sensorType;
    int temperature;
} nvmlTemperature_t;
#define NVML_TEMPERATURE_V1 ((unsigned int)(sizeof(nvmlTemperature_t) | (1u << 24)))
#define NVML_TEMPERATURE_GPU 0

enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_CLOCK_VIDEO = 3 };
enum { NVML_PCIE_UTIL_TX_BYTES = 0, NVML_PCIE_UTIL_RX_BYTES = 1 };

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t; /* nvmlProcessInfo_t (v3) has this layout too */

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

enum { NVML_VALUE_TYPE_UNSIGNED_INT = 1, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3 };
#define NVML_FI_DEV_NVLINK_LINK_COUNT 91
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX 138
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX 139
#define NVML_VALUE_NOT_AVAILABLE_ULL ULLONG_MAX

/* ---- the configuration ---- */

#define MAX_DEVICES 64
#define MAX_LINKS 36
#define MAX_PROCS 64
#define TEXT_SIZE 96

enum field {
    F_MEMORY_TOTAL, F_MEMORY_USED, F_MEMORY_RESERVED, F_UTIL_GPU, F_UTIL_MEMORY, F_ENCODER, F_DECODER, F_TEMPERATURE,
    F_POWER_USAGE, F_POWER_LIMIT, F_GRAPHICS_CLOCK, F_SM_CLOCK, F_MEMORY_CLOCK, F_VIDEO_CLOCK, F_PCIE_RX, F_PCIE_TX,
    F_COUNT
};
static const char *const field_keys[F_COUNT] = {
    "memory_total_bytes", "memory_used_bytes", "memory_reserved_bytes", "utilization_gpu_percent",
    "utilization_memory_percent", "encoder_utilization_percent", "decoder_utilization_percent", "temperature_c",
    "power_usage_mw", "power_limit_mw", "graphics_clock_mhz", "sm_clock_mhz", "memory_clock_mhz", "video_clock_mhz",
    "pcie_rx_kib_per_s", "pcie_tx_kib_per_s",
};

enum query {
    Q_MEMORY, Q_UTILIZATION, Q_ENCODER, Q_DECODER, Q_TEMPERATURE, Q_POWER_USAGE, Q_POWER_LIMIT, Q_GRAPHICS_CLOCK,
    Q_SM_CLOCK, Q_MEMORY_CLOCK, Q_VIDEO_CLOCK, Q_PCIE_RX, Q_PCIE_TX, Q_NVLINK, Q_PROCESSES, Q_COUNT
};
static const char *const query_names[Q_COUNT] = {
    "memory", "utilization", "encoder_utilization", "decoder_utilization", "temperature", "power_usage",
    "power_limit", "graphics_clock", "sm_clock", "memory_clock", "video_clock", "pcie_rx", "pcie_tx", "nvlink",
    "processes",
};

struct link {
    int active;
    unsigned long long rx_kib_per_s, tx_kib_per_s;
};

struct proc {
    unsigned int pid;
    unsigned long long used;
    int graphics;
};

struct device {
    char name[TEXT_SIZE], uuid[TEXT_SIZE];
    unsigned long long v[F_COUNT];
    unsigned int unsupported; /* bit per enum query */
    int nlinks, nprocs;
    struct link links[MAX_LINKS];
    struct proc procs[MAX_PROCS];
};

struct config {
    nvmlReturn_t init_error;
    char driver_version[TEXT_SIZE], nvml_version[TEXT_SIZE];
    int cuda_driver_version;
    int ndevices;
    struct device devices[MAX_DEVICES];
};

/* ---- error names, shared by "init_error" and nvmlErrorString ---- */

static const struct {
    int code;
    const char *name, *text;
} errors[] = {
    {0, "SUCCESS", "Success"},
    {1, "UNINITIALIZED", "Uninitialized"},
    {2, "INVALID_ARGUMENT", "Invalid Argument"},
    {3, "NOT_SUPPORTED", "Not Supported"},
    {4, "NO_PERMISSION", "Insufficient Permissions"},
    {5, "ALREADY_INITIALIZED", "Already Initialized"},
    {6, "NOT_FOUND", "Not Found"},
    {7, "INSUFFICIENT_SIZE", "Insufficient Size"},
    {8, "INSUFFICIENT_POWER", "Insufficient External Power"},
    {9, "DRIVER_NOT_LOADED", "Driver Not Loaded"},
    {10, "TIMEOUT", "Timeout"},
    {11, "IRQ_ISSUE", "Interrupt Request Issue"},
    {12, "LIBRARY_NOT_FOUND", "NVML Shared Library Not Found"},
    {13, "FUNCTION_NOT_FOUND", "Function Not Found"},
    {14, "CORRUPTED_INFOROM", "Corrupted infoROM"},
    {15, "GPU_IS_LOST", "GPU is lost"},
    {16, "RESET_REQUIRED", "GPU requires restart"},
    {17, "OPERATING_SYSTEM", "The operating system has blocked the request."},
    {18, "LIB_RM_VERSION_MISMATCH", "RM has detected an NVML/RM version mismatch."},
    {19, "IN_USE", "In use by another client"},
    {20, "MEMORY", "Insufficient Memory"},
    {21, "NO_DATA", "No data"},
    {25, "ARGUMENT_VERSION_MISMATCH", "Argument version mismatch"},
    {999, "UNKNOWN", "Unknown Error"},
};

/* ---- a small JSON reader: the file is parsed into a tree, read into a config, and the tree freed ---- */

enum jtype { J_NULL, J_BOOL, J_INT, J_REAL, J_STR, J_ARR, J_OBJ };

struct jval {
    enum jtype type;
    long long i; /* J_INT value, J_BOOL 0/1 */
    char *s;     /* J_STR, decoded in place */
    char *key;   /* member name inside an object */
    struct jval *child, *next;
};

struct parser {
    char *p, *end;
    const char *start;
    char err[160];
    struct jval *pool;
    size_t used, cap;
};

static struct jval *jnew(struct parser *ps, enum jtype t) {
    if (ps->used == ps->cap) {
        snprintf(ps->err, sizeof ps->err, "too many values");
        return NULL;
    }
    struct jval *v = &ps->pool[ps->used++];
    memset(v, 0, sizeof *v);
    v->type = t;
    return v;
}

static void jfail(struct parser *ps, const char *what) {
    if (!ps->err[0])
        snprintf(ps->err, sizeof ps->err, "%s at byte %ld", what, (long)(ps->p - ps->start));
}

static void skip_ws(struct parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static char *jstring(struct parser *ps) {
    /* ps->p is on the opening quote; decode in place, so the result never outgrows the source */
    char *out = ++ps->p, *w = out;
    while (ps->p < ps->end && *ps->p != '"') {
        unsigned char c = (unsigned char)*ps->p++;
        if (c < 0x20) {
            jfail(ps, "control character in string");
            return NULL;
        }
        if (c != '\\') {
            *w++ = (char)c;
            continue;
        }
        if (ps->p >= ps->end)
            break;
        c = (unsigned char)*ps->p++;
        switch (c) {
        case '"': case '\\': case '/': *w++ = (char)c; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            unsigned int cp = 0;
            for (int k = 0; k < 4; k++) {
                char h = ps->p < ps->end ? *ps->p++ : 0;
                cp = cp * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0'
                                          : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                          : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 99);
                if (cp > 0xffff) {
                    jfail(ps, "bad \\u escape");
                    return NULL;
                }
            }
            /* names and ids are ASCII in practice; anything wider becomes '?' rather than half a character */
            *w++ = cp < 0x80 && cp > 0 ? (char)cp : '?';
            break;
        }
        default:
            jfail(ps, "bad escape");
            return NULL;
        }
    }
    if (ps->p >= ps->end) {
        jfail(ps, "unterminated string");
        return NULL;
    }
    ps->p++; /* closing quote, which *w may now overwrite */
    *w = '\0';
    return out;
}

static struct jval *jparse(struct parser *ps, int depth);

static struct jval *jnumber(struct parser *ps) {
    char *q = ps->p;
    int real = 0;
    if (q < ps->end && *q == '-')
        q++;
    while (q < ps->end && ((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E' || *q == '+' || *q == '-')) {
        if (*q == '.' || *q == 'e' || *q == 'E')
            real = 1;
        q++;
    }
    char buf[64];
    size_t n = (size_t)(q - ps->p);
    if (n == 0 || n >= sizeof buf) {
        jfail(ps, "bad number");
        return NULL;
    }
    memcpy(buf, ps->p, n);
    buf[n] = '\0';
    struct jval *v = jnew(ps, real ? J_REAL : J_INT);
    if (!v)
        return NULL;
    char *endp;
    errno = 0;
    if (real)
        (void)strtod(buf, &endp);
    else
        v->i = strtoll(buf, &endp, 10);
    if (*endp || errno) {
        jfail(ps, "bad number");
        return NULL;
    }
    ps->p = q;
    return v;
}

static struct jval *jcontainer(struct parser *ps, int depth, int object) {
    struct jval *v = jnew(ps, object ? J_OBJ : J_ARR), **tail;
    if (!v)
        return NULL;
    tail = &v->child;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == (object ? '}' : ']')) {
        ps->p++;
        return v;
    }
    for (;;) {
        char *key = NULL;
        skip_ws(ps);
        if (object) {
            if (ps->p >= ps->end || *ps->p != '"') {
                jfail(ps, "expected a member name");
                return NULL;
            }
            if (!(key = jstring(ps)))
                return NULL;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                jfail(ps, "expected ':'");
                return NULL;
            }
            ps->p++;
        }
        struct jval *item = jparse(ps, depth + 1);
        if (!item)
            return NULL;
        item->key = key;
        *tail = item;
        tail = &item->next;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == (object ? '}' : ']')) {
            ps->p++;
            return v;
        }
        jfail(ps, object ? "expected ',' or '}'" : "expected ',' or ']'");
        return NULL;
    }
}

static int literal(struct parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) >= n && memcmp(ps->p, word, n) == 0) {
        ps->p += n;
        return 1;
    }
    return 0;
}

static struct jval *jparse(struct parser *ps, int depth) {
    struct jval *v;
    if (depth > 16) {
        jfail(ps, "nested too deeply");
        return NULL;
    }
    skip_ws(ps);
    if (ps->p >= ps->end) {
        jfail(ps, "unexpected end");
        return NULL;
    }
    switch (*ps->p) {
    case '{': return jcontainer(ps, depth, 1);
    case '[': return jcontainer(ps, depth, 0);
    case '"':
        if (!(v = jnew(ps, J_STR)))
            return NULL;
        return (v->s = jstring(ps)) ? v : NULL;
    default:
        if (literal(ps, "null"))
            return jnew(ps, J_NULL);
        if (literal(ps, "true")) {
            if ((v = jnew(ps, J_BOOL)))
                v->i = 1;
            return v;
        }
        if (literal(ps, "false"))
            return jnew(ps, J_BOOL);
        if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9'))
            return jnumber(ps);
        jfail(ps, "unexpected character");
        return NULL;
    }
}

/* ---- reading the tree into a config ---- */

static int bad(char *err, size_t n, const char *where, const char *key, const char *what) {
    snprintf(err, n, "%s%s%s: %s", where, key ? "." : "", key ? key : "", what);
    return -1;
}

static int get_uint(const struct jval *v, unsigned long long max, unsigned long long *out) {
    if (v->type != J_INT || v->i < 0 || (unsigned long long)v->i > max)
        return -1;
    *out = (unsigned long long)v->i;
    return 0;
}

static int get_text(const struct jval *v, char *dst) {
    if (v->type != J_STR || strlen(v->s) >= TEXT_SIZE)
        return -1;
    strcpy(dst, v->s);
    return 0;
}

static int read_links(const struct jval *arr, struct device *d, const char *where, char *err, size_t n) {
    char at[96];
    if (arr->type != J_ARR)
        return bad(err, n, where, "nvlink", "expected a list");
    d->nlinks = 0;
    for (const struct jval *l = arr->child; l; l = l->next) {
        if (d->nlinks == MAX_LINKS)
            return bad(err, n, where, "nvlink", "more than 36 links");
        snprintf(at, sizeof at, "%s.nvlink[%d]", where, d->nlinks);
        struct link *k = &d->links[d->nlinks++];
        memset(k, 0, sizeof *k);
        if (l->type != J_OBJ)
            return bad(err, n, at, NULL, "expected an object");
        for (const struct jval *m = l->child; m; m = m->next) {
            if (strcmp(m->key, "active") == 0) {
                if (m->type != J_BOOL)
                    return bad(err, n, at, m->key, "expected true or false");
                k->active = (int)m->i;
            } else if (strcmp(m->key, "rx_kib_per_s") == 0 || strcmp(m->key, "tx_kib_per_s") == 0) {
                if (get_uint(m, LLONG_MAX, m->key[0] == 'r' ? &k->rx_kib_per_s : &k->tx_kib_per_s))
                    return bad(err, n, at, m->key, "expected a non-negative integer");
            } else {
                return bad(err, n, at, m->key, "unknown key");
            }
        }
    }
    return 0;
}

static int read_procs(const struct jval *arr, struct device *d, const char *where, char *err, size_t n) {
    char at[96];
    if (arr->type != J_ARR)
        return bad(err, n, where, "processes", "expected a list");
    d->nprocs = 0;
    for (const struct jval *e = arr->child; e; e = e->next) {
        if (d->nprocs == MAX_PROCS)
            return bad(err, n, where, "processes", "more than 64 processes");
        snprintf(at, sizeof at, "%s.processes[%d]", where, d->nprocs);
        struct proc *p = &d->procs[d->nprocs++];
        memset(p, 0, sizeof *p);
        if (e->type != J_OBJ)
            return bad(err, n, at, NULL, "expected an object");
        for (const struct jval *m = e->child; m; m = m->next) {
            unsigned long long x;
            if (strcmp(m->key, "pid") == 0) {
                if (get_uint(m, UINT_MAX, &x))
                    return bad(err, n, at, m->key, "expected a process id");
                p->pid = (unsigned int)x;
            } else if (strcmp(m->key, "used_gpu_memory_bytes") == 0) {
                if (m->type == J_NULL)
                    p->used = NVML_VALUE_NOT_AVAILABLE_ULL;
                else if (get_uint(m, LLONG_MAX, &p->used))
                    return bad(err, n, at, m->key, "expected a non-negative integer or null");
            } else if (strcmp(m->key, "type") == 0) {
                if (m->type != J_STR || (strcmp(m->s, "compute") != 0 && strcmp(m->s, "graphics") != 0))
                    return bad(err, n, at, m->key, "expected \"compute\" or \"graphics\"");
                p->graphics = m->s[0] == 'g';
            } else {
                return bad(err, n, at, m->key, "unknown key");
            }
        }
    }
    return 0;
}

static int read_device(const struct jval *obj, struct device *d, int index, char *err, size_t n) {
    char where[32];
    snprintf(where, sizeof where, "devices[%d]", index);
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "NVIDIA Mock GPU");
    snprintf(d->uuid, sizeof d->uuid, "GPU-00000000-0000-0000-0000-%012d", index);
    if (obj->type != J_OBJ)
        return bad(err, n, where, NULL, "expected an object");
    for (const struct jval *m = obj->child; m; m = m->next) {
        int f;
        for (f = 0; f < F_COUNT && strcmp(m->key, field_keys[f]) != 0; f++)
            ;
        if (f < F_COUNT) {
            /* NVML hands memory out as unsigned long long and everything else as unsigned int */
            unsigned long long max = f <= F_MEMORY_RESERVED ? (unsigned long long)LLONG_MAX : UINT_MAX;
            if (get_uint(m, max, &d->v[f]))
                return bad(err, n, where, m->key, "expected a non-negative integer in range");
        } else if (strcmp(m->key, "name") == 0) {
            if (get_text(m, d->name))
                return bad(err, n, where, m->key, "expected a string under 96 bytes");
        } else if (strcmp(m->key, "uuid") == 0) {
            if (get_text(m, d->uuid))
                return bad(err, n, where, m->key, "expected a string under 96 bytes");
        } else if (strcmp(m->key, "nvlink") == 0) {
            if (read_links(m, d, where, err, n))
                return -1;
        } else if (strcmp(m->key, "processes") == 0) {
            if (read_procs(m, d, where, err, n))
                return -1;
        } else if (strcmp(m->key, "not_supported") == 0) {
            if (m->type != J_ARR)
                return bad(err, n, where, m->key, "expected a list of query names");
            for (const struct jval *q = m->child; q; q = q->next) {
                int k;
                for (k = 0; k < Q_COUNT && !(q->type == J_STR && strcmp(q->s, query_names[k]) == 0); k++)
                    ;
                if (k == Q_COUNT)
                    return bad(err, n, where, m->key, "unknown query name");
                d->unsupported |= 1u << k;
            }
        } else {
            return bad(err, n, where, m->key, "unknown key");
        }
    }
    return 0;
}

static int error_code(const struct jval *v, nvmlReturn_t *out) {
    if (v->type == J_NULL) {
        *out = NVML_SUCCESS;
        return 0;
    }
    if (v->type == J_INT && v->i >= 0 && v->i <= INT_MAX) {
        *out = (nvmlReturn_t)v->i;
        return 0;
    }
    if (v->type == J_STR)
        for (size_t k = 0; k < sizeof errors / sizeof errors[0]; k++)
            if (strcmp(v->s, errors[k].name) == 0) {
                *out = errors[k].code;
                return 0;
            }
    return -1;
}

static int read_config(const struct jval *root, struct config *c, char *err, size_t n) {
    memset(c, 0, sizeof *c);
    snprintf(c->driver_version, sizeof c->driver_version, "550.54.15");
    snprintf(c->nvml_version, sizeof c->nvml_version, "12.550.54.15");
    c->cuda_driver_version = 12040;
    if (root->type != J_OBJ)
        return bad(err, n, "document", NULL, "expected an object");
    for (const struct jval *m = root->child; m; m = m->next) {
        unsigned long long x;
        if (strcmp(m->key, "init_error") == 0) {
            if (error_code(m, &c->init_error))
                return bad(err, n, "document", m->key, "expected null, an NVML error name or code");
        } else if (strcmp(m->key, "driver_version") == 0) {
            if (get_text(m, c->driver_version))
                return bad(err, n, "document", m->key, "expected a string");
        } else if (strcmp(m->key, "nvml_version") == 0) {
            if (get_text(m, c->nvml_version))
                return bad(err, n, "document", m->key, "expected a string");
        } else if (strcmp(m->key, "cuda_driver_version") == 0) {
            if (get_uint(m, INT_MAX, &x))
                return bad(err, n, "document", m->key, "expected an integer such as 12040");
            c->cuda_driver_version = (int)x;
        } else if (strcmp(m->key, "devices") == 0) {
            if (m->type != J_ARR)
                return bad(err, n, "document", m->key, "expected a list");
            for (const struct jval *d = m->child; d; d = d->next) {
                if (c->ndevices == MAX_DEVICES)
                    return bad(err, n, "document", m->key, "more than 64 devices");
                if (read_device(d, &c->devices[c->ndevices], c->ndevices, err, n))
                    return -1;
                c->ndevices++;
            }
        } else {
            return bad(err, n, "document", m->key, "unknown key");
        }
    }
    return 0;
}

/* ---- state: the config in force, the file it came from, NVLink counters ---- */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct config *current;
static int init_count;
static struct {
    int known;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} seen;
static struct nvmlDevice_st handles[MAX_DEVICES];

/* NVLink data counters in KiB: they advance at the configured rate whenever they are read */
static struct {
    long long at_us;
    double rx_kib, tx_kib;
} counters[MAX_DEVICES][MAX_LINKS];

static long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static struct config *parse_file(const char *path, size_t size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *text = malloc(size + 1);
    struct config *c = malloc(sizeof *c);
    struct parser ps = {0};
    size_t got = text ? fread(text, 1, size, f) : 0;
    fclose(f);
    if (!text || !c || got != size) {
        free(text);
        free(c);
        return NULL;
    }
    ps.p = text;
    ps.start = text;
    ps.end = text + size;
    ps.cap = size + 1; /* every value takes at least one byte of text */
    ps.pool = malloc(ps.cap * sizeof *ps.pool);
    struct jval *root = ps.pool ? jparse(&ps, 0) : NULL;
    if (root) {
        skip_ws(&ps);
        if (ps.p != ps.end) {
            jfail(&ps, "trailing characters");
            root = NULL;
        }
    }
    if (!root || read_config(root, c, ps.err, sizeof ps.err)) {
        fprintf(stderr, "gswarm mock nvml: %s: %s\n", path, ps.err[0] ? ps.err : "out of memory");
        free(c);
        c = NULL;
    }
    free(ps.pool);
    free(text);
    return c;
}

/* Called with the lock held: parse the file again when it changed since the last look. */
static void refresh(void) {
    const char *path = getenv("GSWARM_MOCK_NVML_CONFIG");
    struct stat st;
    if (!path || !*path || stat(path, &st) != 0)
        return; /* the last good config stays */
    if (seen.known && seen.dev == st.st_dev && seen.ino == st.st_ino && seen.size == st.st_size &&
        seen.mtime.tv_sec == st.st_mtim.tv_sec && seen.mtime.tv_nsec == st.st_mtim.tv_nsec)
        return;
    seen.known = 1;
    seen.dev = st.st_dev;
    seen.ino = st.st_ino;
    seen.size = st.st_size;
    seen.mtime = st.st_mtim;
    struct config *c = parse_file(path, (size_t)st.st_size);
    if (c) {
        free(current);
        current = c;
    }
}

/* Lock, refresh and find the device behind a handle; on success the caller unlocks. */
static nvmlReturn_t enter(nvmlDevice_t handle, const struct device **out) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (init_count == 0 || !current)
        rc = NVML_ERROR_UNINITIALIZED;
    else if (handle < &handles[0] || handle >= &handles[MAX_DEVICES])
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else {
        refresh();
        if (handle->index >= (unsigned int)current->ndevices)
            rc = NVML_ERROR_GPU_IS_LOST; /* the file lost this device since the handle was given out */
        else
            *out = &current->devices[handle->index];
    }
    if (rc != NVML_SUCCESS)
        pthread_mutex_unlock(&lock);
    return rc;
}

static nvmlReturn_t leave(nvmlReturn_t rc) {
    pthread_mutex_unlock(&lock);
    return rc;
}

static nvmlReturn_t copy_text(const char *text, char *dst, unsigned int length) {
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) >= length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, text);
    return NVML_SUCCESS;
}

/* One unsigned int of one device, or NOT_SUPPORTED where the file says so. */
static nvmlReturn_t read_uint(nvmlDevice_t handle, enum query q, enum field f, unsigned int *out) {
    const struct device *d;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = enter(handle, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (d->unsupported & (1u << q))
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *out = (unsigned int)d->v[f];
    return leave(NVML_SUCCESS);
}

/* ---- initialisation ---- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    refresh();
    nvmlReturn_t rc = !current ? NVML_ERROR_DRIVER_NOT_LOADED : current->init_error;
    if (rc == NVML_SUCCESS) {
        init_count++;
        for (unsigned int i = 0; i < MAX_DEVICES; i++)
            handles[i].index = i;
    }
    return leave(rc);
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    if (init_count == 0)
        return leave(NVML_ERROR_UNINITIALIZED);
    init_count--;
    return leave(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    for (size_t k = 0; k < sizeof errors / sizeof errors[0]; k++)
        if (errors[k].code == result)
            return errors[k].text;
    return "Unknown Error";
}

/* ---- system ---- */

static nvmlReturn_t enter_system(void) {
    pthread_mutex_lock(&lock);
    if (init_count == 0 || !current) {
        pthread_mutex_unlock(&lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    refresh();
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t rc = enter_system();
    return rc != NVML_SUCCESS ? rc : leave(copy_text(current->driver_version, version, length));
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t rc = enter_system();
    return rc != NVML_SUCCESS ? rc : leave(copy_text(current->nvml_version, version, length));
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = enter_system();
    if (rc != NVML_SUCCESS)
        return rc;
    *version = current->cuda_driver_version;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

/* ---- devices ---- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = enter_system();
    if (rc != NVML_SUCCESS)
        return rc;
    *count = (unsigned int)current->ndevices;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = enter_system();
    if (rc != NVML_SUCCESS)
        return rc;
    if (index >= (unsigned int)current->ndevices)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = &handles[index];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = enter_system();
    if (rc != NVML_SUCCESS)
        return rc;
    for (int i = 0; i < current->ndevices; i++)
        if (strcmp(current->devices[i].uuid, uuid) == 0) {
            *device = &handles[i];
            return leave(NVML_SUCCESS);
        }
    return leave(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    const struct device *d;
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = enter(device, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    *index = device->index;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    const struct device *d;
    nvmlReturn_t rc = enter(device, &d);
    return rc != NVML_SUCCESS ? rc : leave(copy_text(d->name, name, length));
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    const struct device *d;
    nvmlReturn_t rc = enter(device, &d);
    return rc != NVML_SUCCESS ? rc : leave(copy_text(d->uuid, uuid, length));
}

/* ---- memory ---- */

static nvmlReturn_t memory(nvmlDevice_t device, unsigned long long *total, unsigned long long *reserved,
                           unsigned long long *used) {
    const struct device *d;
    nvmlReturn_t rc = enter(device, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (d->unsupported & (1u << Q_MEMORY))
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *total = d->v[F_MEMORY_TOTAL];
    *reserved = d->v[F_MEMORY_RESERVED];
    *used = d->v[F_MEMORY_USED];
    return leave(NVML_SUCCESS);
}

static unsigned long long minus(unsigned long long a, unsigned long long b) { return a > b ? a - b : 0; }

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *out) {
    unsigned long long total, reserved, used;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = memory(device, &total, &reserved, &used);
    if (rc != NVML_SUCCESS)
        return rc;
    /* the v1 call counts the reserved memory as used */
    out->total = total;
    out->used = used + reserved;
    out->free = minus(total, used + reserved);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *out) {
    unsigned long long total, reserved, used;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (out->version != NVML_MEMORY_V2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t rc = memory(device, &total, &reserved, &used);
    if (rc != NVML_SUCCESS)
        return rc;
    out->total = total;
    out->reserved = reserved;
    out->used = used;
    out->free = minus(total, used + reserved);
    return NVML_SUCCESS;
}

/* ---- utilisation, temperature, power, clocks, PCIe ---- */

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *out) {
    const struct device *d;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = enter(device, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (d->unsupported & (1u << Q_UTILIZATION))
        return leave(NVML_ERROR_NOT_SUPPORTED);
    out->gpu = (unsigned int)d->v[F_UTIL_GPU];
    out->memory = (unsigned int)d->v[F_UTIL_MEMORY];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *util, unsigned int *period_us) {
    if (!period_us)
        return NVML_ERROR_INVALID_ARGUMENT;
    *period_us = 167000;
    return read_uint(device, Q_ENCODER, F_ENCODER, util);
}

EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *util, unsigned int *period_us) {
    if (!period_us)
        return NVML_ERROR_INVALID_ARGUMENT;
    *period_us = 167000;
    return read_uint(device, Q_DECODER, F_DECODER, util);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    if (sensor != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    return read_uint(device, Q_TEMPERATURE, F_TEMPERATURE, temp);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    unsigned int t;
    if (!temperature)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (temperature->version != NVML_TEMPERATURE_V1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t rc = nvmlDeviceGetTemperature(device, temperature->sensorType, &t);
    if (rc == NVML_SUCCESS)
        temperature->temperature = (int)t;
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power_mw) {
    return read_uint(device, Q_POWER_USAGE, F_POWER_USAGE, power_mw);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit_mw) {
    return read_uint(device, Q_POWER_LIMIT, F_POWER_LIMIT, limit_mw);
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit_mw) {
    return read_uint(device, Q_POWER_LIMIT, F_POWER_LIMIT, limit_mw);
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock_mhz) {
    switch (type) {
    case NVML_CLOCK_GRAPHICS: return read_uint(device, Q_GRAPHICS_CLOCK, F_GRAPHICS_CLOCK, clock_mhz);
    case NVML_CLOCK_SM: return read_uint(device, Q_SM_CLOCK, F_SM_CLOCK, clock_mhz);
    case NVML_CLOCK_MEM: return read_uint(device, Q_MEMORY_CLOCK, F_MEMORY_CLOCK, clock_mhz);
    case NVML_CLOCK_VIDEO: return read_uint(device, Q_VIDEO_CLOCK, F_VIDEO_CLOCK, clock_mhz);
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *clock_mhz) {
    return nvmlDeviceGetClockInfo(device, type, clock_mhz);
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, int counter, unsigned int *kib_per_s) {
    switch (counter) {
    case NVML_PCIE_UTIL_TX_BYTES: return read_uint(device, Q_PCIE_TX, F_PCIE_TX, kib_per_s);
    case NVML_PCIE_UTIL_RX_BYTES: return read_uint(device, Q_PCIE_RX, F_PCIE_RX, kib_per_s);
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

/* ---- NVLink ---- */

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *is_active) {
    const struct device *d;
    if (!is_active)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = enter(device, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (d->unsupported & (1u << Q_NVLINK))
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (link >= (unsigned int)d->nlinks)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *is_active = d->links[link].active;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    const struct device *d;
    if (count < 0 || (count > 0 && !values))
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = enter(device, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned int index = device->index;
    long long now = now_us();
    /* every link's counters move to one instant, so a TX and an RX value read together share their timestamp */
    for (int l = 0; l < d->nlinks; l++) {
        long long dt = counters[index][l].at_us ? now - counters[index][l].at_us : 0;
        if (dt > 0 && d->links[l].active) {
            counters[index][l].rx_kib += (double)d->links[l].rx_kib_per_s * (double)dt / 1e6;
            counters[index][l].tx_kib += (double)d->links[l].tx_kib_per_s * (double)dt / 1e6;
        }
        counters[index][l].at_us = now;
    }
    for (int k = 0; k < count; k++) {
        nvmlFieldValue_t *fv = &values[k];
        fv->timestamp = now;
        fv->latencyUsec = 0;
        fv->value.ullVal = 0;
        switch (fv->fieldId) {
        case NVML_FI_DEV_NVLINK_LINK_COUNT:
            if (d->unsupported & (1u << Q_NVLINK)) {
                fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
                break;
            }
            fv->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            fv->value.uiVal = (unsigned int)d->nlinks;
            fv->nvmlReturn = NVML_SUCCESS;
            break;
        case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
        case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
            if (d->unsupported & (1u << Q_NVLINK)) {
                fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
                break;
            }
            if (fv->scopeId >= (unsigned int)d->nlinks) {
                fv->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
                break;
            }
            fv->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            fv->value.ullVal = (unsigned long long)(fv->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
                                                        ? counters[index][fv->scopeId].tx_kib
                                                        : counters[index][fv->scopeId].rx_kib);
            fv->nvmlReturn = NVML_SUCCESS;
            break;
        default:
            fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return leave(NVML_SUCCESS);
}

/* ---- processes ---- */

/* Fill a v1 (16-byte) or v2/v3 (24-byte) process list; the count protocol is NVML's: ask, then fetch. */
static nvmlReturn_t processes(nvmlDevice_t device, int graphics, int mps, unsigned int *count, void *infos, int v1) {
    const struct device *d;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = enter(device, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    if (d->unsupported & (1u << Q_PROCESSES))
        return leave(NVML_ERROR_NOT_SUPPORTED);
    unsigned int n = 0;
    for (int k = 0; k < d->nprocs && !mps; k++)
        n += d->procs[k].graphics == graphics;
    if (*count < n || (n > 0 && !infos)) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    *count = n;
    unsigned int w = 0;
    for (int k = 0; k < d->nprocs && !mps; k++) {
        const struct proc *p = &d->procs[k];
        if (p->graphics != graphics)
            continue;
        if (v1) {
            nvmlProcessInfo_v1_t *o = (nvmlProcessInfo_v1_t *)infos + w++;
            o->pid = p->pid;
            o->usedGpuMemory = p->used;
        } else {
            nvmlProcessInfo_v2_t *o = (nvmlProcessInfo_v2_t *)infos + w++;
            o->pid = p->pid;
            o->usedGpuMemory = p->used;
            o->gpuInstanceId = 0xFFFFFFFFu; /* no MIG */
            o->computeInstanceId = 0xFFFFFFFFu;
        }
    }
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                            nvmlProcessInfo_v2_t *infos) {
    return processes(device, 0, 0, count, infos, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                            nvmlProcessInfo_v2_t *infos) {
    return processes(device, 0, 0, count, infos, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                         nvmlProcessInfo_v1_t *infos) {
    return processes(device, 0, 0, count, infos, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                             nvmlProcessInfo_v2_t *infos) {
    return processes(device, 1, 0, count, infos, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                             nvmlProcessInfo_v2_t *infos) {
    return processes(device, 1, 0, count, infos, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                          nvmlProcessInfo_v1_t *infos) {
    return processes(device, 1, 0, count, infos, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                               nvmlProcessInfo_v2_t *infos) {
    return processes(device, 0, 1, count, infos, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *samples,
                                                    unsigned int *count, unsigned long long last_seen_us) {
    const struct device *d;
    (void)samples;
    (void)last_seen_us;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = enter(device, &d);
    if (rc != NVML_SUCCESS)
        return rc;
    *count = 0;
    return leave(NVML_ERROR_NOT_FOUND); /* what NVML answers when it holds no samples newer than last_seen_us */
}
