/* TAP tests of device selection that need no GPU: sd_devices_shared, which tells the training
 * ranks whether two of them use one GPU (NCCL's device path needs one GPU per rank), and the
 * CPU choice, whose UUID is all zero. */
#include "sdtrain/device.h"

#include <string.h>

#include "tap.h"

static void set(unsigned char *u, int i, int v)
{
    memset(u + 16 * i, 0, 16);
    if (v) {
        u[16 * i] = (unsigned char)v;
        u[16 * i + 15] = 0xa5;
    }
}

int main(void)
{
    unsigned char u[16 * 8];
    int a = -1, b = -1;
    sd_device_info d;
    sd_err err;

    for (int i = 0; i < 8; i++)
        set(u, i, i + 1);
    tap_ok(!sd_devices_shared(u, 8, &a, &b), "8 ranks, 8 GPUs: none shared");
    int r;
    set(u, 6, 3);
    r = sd_devices_shared(u, 8, &a, &b);
    tap_ok(r && a == 2 && b == 6, "ranks 2 and 6 share a GPU (%d, %d)", a, b);
    set(u, 5, 2);
    r = sd_devices_shared(u, 8, &a, &b);
    tap_ok(r && a == 1 && b == 5, "the first pair is reported (%d, %d)", a, b);
    /* one UUID byte apart: different GPUs */
    for (int i = 0; i < 8; i++)
        set(u, i, 7);
    for (int i = 0; i < 8; i++)
        u[16 * i + 8] = (unsigned char)i;
    tap_ok(!sd_devices_shared(u, 8, &a, &b), "UUIDs that differ in one byte are different GPUs");
    /* CPU ranks (zero UUIDs) never count as sharing */
    for (int i = 0; i < 8; i++)
        set(u, i, 0);
    tap_ok(!sd_devices_shared(u, 8, &a, &b), "all-zero UUIDs (CPU ranks) share nothing");
    tap_ok(!sd_devices_shared(u, 1, &a, &b) && !sd_devices_shared(u, 0, &a, &b),
           "one rank or none: nothing shared");

    memset(&d, 0x5a, sizeof d);
    tap_ok(sd_device_resolve("cpu", 0, &d, &err) == 0 && !d.use_cuda &&
               !memcmp(d.uuid, (unsigned char[16]){0}, 16) && !strcmp(d.name, "cpu"),
           "device 'cpu': no GPU, a zero UUID");
    return tap_done();
}
