/* q16_amx_avx512.c — the 16-row interleave GEMM on the CPU's AMX tiles (kernels/q16_amx.h). Compiled
 * with the AVX-512 flags: the tile instructions are inline assembly (below), so the build needs an
 * assembler that knows them (binutils 2.36 or later), not a compiler's AMX flags. Runs only when
 * kiln_q16_amx_kernel (gemv.c) has seen the CPU report AMX-INT8 and Linux grant this process the tile
 * data state. */
#include "kernels/gemv.h"
#include "kernels/gemv_isa.h"

/* The instructions in inline assembly of our own rather than GCC 12's <amxtileintrin.h> macros:
 * there, ldtilecfg names only the first 8 bytes of the configuration as its operand and tileloadd
 * no memory at all, so the compiler may drop or sink the stores that build the configuration and
 * the unpacked B tile (it sees nothing read them). Here the configuration is a whole-struct operand
 * and every load and store clobbers memory. */
#ifdef KILN_NO_AMX_ASM /* an assembler without the tile instructions (Makefile): never called (gemv.c) */
#define AMX_CONFIG(c) ((void)(c), __builtin_trap())
#define AMX_ZERO(t) __builtin_trap()
#define AMX_LOAD(t, p, s) ((void)(p), (void)(s), __builtin_trap())
#define AMX_STORE(t, p, s) ((void)(p), (void)(s), __builtin_trap())
#define AMX_DPBSUD(c, a, b) __builtin_trap()
#define AMX_RELEASE() __builtin_trap()
#define Q16_AMX_NAME kiln_q16_amx_hw
#define K16_AMX_NAME kiln_k16_amx_hw
#include "kernels/q16_amx.h"
double kiln_amx_peak_macs(int64_t iters) { return (double)iters * 0.0; }
#else
#define Q16_AMX_NAME kiln_q16_amx_hw
#define K16_AMX_NAME kiln_k16_amx_hw
#define AMX_CONFIG(c) __asm__ volatile("ldtilecfg %0" ::"m"(*(const amx_tilecfg *)(c)) : "memory")
#define AMX_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define AMX_LOAD(t, p, s) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void *)(p)), "r"((long)(s)) : "memory")
#define AMX_STORE(t, p, s) __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"((void *)(p)), "r"((long)(s)) : "memory")
/* tdpbsud c, a, b (Intel order): c += a (signed bytes) · b (unsigned bytes); AT&T lists them reversed */
#define AMX_DPBSUD(c, a, b) __asm__ volatile("tdpbsud %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define AMX_RELEASE() __asm__ volatile("tilerelease" ::)
#include "kernels/q16_amx.h"

double kiln_amx_peak_macs(int64_t iters) {
    amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int i = 0; i < 6; i++) cfg.rows[i] = 16, cfg.colsb[i] = 64; /* C 0..3, A 4, B 5 */
    static const uint8_t zeros[1024] __attribute__((aligned(64)));
    AMX_CONFIG(&cfg);
    AMX_LOAD(4, zeros, 64);
    AMX_LOAD(5, zeros, 64);
    AMX_ZERO(0);
    AMX_ZERO(1);
    AMX_ZERO(2);
    AMX_ZERO(3);
    for (int64_t i = 0; i < iters; i++) {
        AMX_DPBSUD(0, 4, 5);
        AMX_DPBSUD(1, 4, 5);
        AMX_DPBSUD(2, 4, 5);
        AMX_DPBSUD(3, 4, 5);
    }
    AMX_RELEASE();
    return (double)iters * 4.0 * 16 * 16 * 64;
}
#endif
