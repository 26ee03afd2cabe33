/* q16_amxemu_avx512.c — the AMX 16-row interleave GEMM (kernels/q16_amx.h) over an emulation of the
 * tile instructions in C, for tests on CPUs without AMX (kiln_kernels_amx(KILN_AMX_EMULATED)): the
 * kernel's tile shapes, strides, operand order and unpacking are checked here against the AVX-512
 * kernel's results bit for bit; only the instructions themselves are not the CPU's. The emulation
 * follows the Intel SDM's pseudo-code: tileloadd fills the configured rows × bytes and zeroes the
 * rest, tdpbsud adds per C dword n of row m the products of A's signed bytes 4k..4k+3 of row m with
 * B's unsigned bytes 4n..4n+3 of row k, k < A's bytes per row / 4. A shape the hardware would refuse
 * (#GP / #UD: palette, reserved bytes, rows, bytes per row, mismatched K / M / N, a tile left
 * unconfigured) counts a fault (kiln_amx_emu_faults). */
#include "kernels/gemv.h"
#include "kernels/gemv_isa.h"
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct { uint8_t d[16][64]; int rows, colsb; } emu_tile;
static _Thread_local emu_tile tiles[8];
static atomic_ullong faults;

unsigned long long kiln_amx_emu_faults(void) { return atomic_load(&faults); }
static void fault(void) { atomic_fetch_add(&faults, 1); }

/* ldtilecfg: palette 0 releases (every tile unconfigured); palette 1 needs start_row and the
 * reserved bytes (2..15, the colsb of tiles 8..15 at 32..47, the rows of tiles 8..15 at 56..63) zero
 * (#GP otherwise), rows ≤ 16, bytes per row ≤ 64. */
static void emu_config(const void *cfg) {
    const uint8_t *c = cfg;
    if (c[0] > 1) fault();
    for (int i = 1; i < 16; i++)
        if (c[i]) fault();
    for (int i = 32; i < 48; i++)
        if (c[i]) fault();
    for (int i = 56; i < 64; i++)
        if (c[i]) fault();
    for (int i = 0; i < 8; i++) {
        uint16_t colsb;
        memcpy(&colsb, c + 16 + 2 * i, 2);
        tiles[i].rows = c[0] == 1 ? c[48 + i] : 0;
        tiles[i].colsb = c[0] == 1 ? colsb : 0;
        if (tiles[i].rows > 16 || tiles[i].colsb > 64 || (tiles[i].rows == 0) != (tiles[i].colsb == 0)) fault();
        memset(tiles[i].d, 0, sizeof tiles[i].d);
    }
}
/* an instruction on a tile the configuration left empty: #UD on the hardware */
static void need(int t) {
    if (tiles[t].rows == 0) fault();
}
static void emu_zero(int t) {
    need(t);
    memset(tiles[t].d, 0, sizeof tiles[t].d);
}
static void emu_load(int t, const void *p, size_t stride) {
    emu_tile *x = &tiles[t];
    need(t);
    memset(x->d, 0, sizeof x->d);
    for (int r = 0; r < x->rows; r++) memcpy(x->d[r], (const uint8_t *)p + (size_t)r * stride, (size_t)x->colsb);
}
static void emu_store(int t, void *p, size_t stride) {
    const emu_tile *x = &tiles[t];
    need(t);
    for (int r = 0; r < x->rows; r++) memcpy((uint8_t *)p + (size_t)r * stride, x->d[r], (size_t)x->colsb);
}
static void emu_dpbsud(int tc, int ta, int tb) {
    emu_tile *c = &tiles[tc];
    const emu_tile *a = &tiles[ta], *b = &tiles[tb];
    need(tc), need(ta), need(tb);
    if (a->colsb % 4 || a->colsb / 4 != b->rows || c->colsb != b->colsb || c->rows != a->rows || tc == ta || tc == tb || ta == tb) fault();
    for (int m = 0; m < c->rows; m++)
        for (int n = 0; n < c->colsb / 4; n++) {
            int32_t acc;
            memcpy(&acc, c->d[m] + 4 * n, 4);
            for (int k = 0; k < a->colsb / 4; k++)
                for (int i = 0; i < 4; i++) acc += (int32_t)(int8_t)a->d[m][4 * k + i] * (int32_t)b->d[k][4 * n + i];
            memcpy(c->d[m] + 4 * n, &acc, 4);
        }
}
/* tilerelease: every tile unconfigured until the next ldtilecfg */
static void emu_release(void) {
    for (int i = 0; i < 8; i++) tiles[i].rows = tiles[i].colsb = 0;
}

#define Q16_AMX_NAME kiln_q16_amx_emu
#define K16_AMX_NAME kiln_k16_amx_emu
#define AMX_CONFIG(c) emu_config(c)
#define AMX_ZERO(t) emu_zero(t)
#define AMX_LOAD(t, p, s) emu_load(t, p, s)
#define AMX_STORE(t, p, s) emu_store(t, p, s)
#define AMX_DPBSUD(c, a, b) emu_dpbsud(c, a, b)
#define AMX_RELEASE() emu_release()
#include "kernels/q16_amx.h"
