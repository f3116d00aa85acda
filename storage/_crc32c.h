/*
 * storage/_crc32c.h: CRC32C for the native accelerators (storage/_entry_records.c,
 * broker/entry_format/_common_entry.c), the same as the ``crc32c`` package's ``crc32c(data,
 * value)``: with the processor's SSE 4.2 instruction where it has one, else through that package.
 *
 * Use: call ``crc32c_init()`` once when the module loads (it imports the package); then
 * ``crc32c_of(crc, p, n, &out)`` continues a CRC over ``p[0:n]`` (0 to start one) and returns 0,
 * or -1 with a Python exception set. ``crc32c_use_instruction(flag)`` turns the instruction off
 * (tests take the package's path so on machines that have it).
 */
#ifndef MAGNETAR_CRC32C_H
#define MAGNETAR_CRC32C_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define CRC32C_HAVE_INSTRUCTION 1
#endif

static PyObject *crc32c_package_function = NULL;
static int crc32c_instruction_used = 0;

#ifdef CRC32C_HAVE_INSTRUCTION
__attribute__((target("sse4.2"))) static uint32_t crc32c_instruction(uint32_t crc, const uint8_t *p, Py_ssize_t n) {
    uint64_t state = ~crc;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t word;
        memcpy(&word, p, sizeof word); /* little-endian: the bytes in memory order, as CRC32C wants */
        state = _mm_crc32_u64(state, word);
    }
    uint32_t low = (uint32_t)state;
    for (; n > 0; p++, n--) {
        low = _mm_crc32_u8(low, *p);
    }
    return ~low;
}
#endif

static int crc32c_init(void) {
    PyObject *package = PyImport_ImportModule("crc32c");
    if (package == NULL) {
        return -1;
    }
    crc32c_package_function = PyObject_GetAttrString(package, "crc32c");
    Py_DECREF(package);
    if (crc32c_package_function == NULL) {
        return -1;
    }
#ifdef CRC32C_HAVE_INSTRUCTION
    __builtin_cpu_init();
    crc32c_instruction_used = __builtin_cpu_supports("sse4.2");
#endif
    return 0;
}

static int crc32c_use_instruction(int wanted) {
#ifdef CRC32C_HAVE_INSTRUCTION
    crc32c_instruction_used = wanted && __builtin_cpu_supports("sse4.2");
#else
    (void)wanted;
#endif
    return crc32c_instruction_used;
}

static int crc32c_of(uint32_t crc, const uint8_t *p, Py_ssize_t n, uint32_t *out) {
#ifdef CRC32C_HAVE_INSTRUCTION
    if (crc32c_instruction_used) {
        *out = crc32c_instruction(crc, p, n);
        return 0;
    }
#endif
    PyObject *view = PyMemoryView_FromMemory((char *)p, n, PyBUF_READ);
    if (view == NULL) {
        return -1;
    }
    PyObject *seed = PyLong_FromUnsignedLong(crc);
    if (seed == NULL) {
        Py_DECREF(view);
        return -1;
    }
    PyObject *result = PyObject_CallFunctionObjArgs(crc32c_package_function, view, seed, NULL);
    Py_DECREF(view);
    Py_DECREF(seed);
    if (result == NULL) {
        return -1;
    }
    unsigned long value = PyLong_AsUnsignedLong(result);
    Py_DECREF(result);
    if (value == (unsigned long)-1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (uint32_t)value;
    return 0;
}

#endif
