#version 450
// copy_rows.comp — dst[d_off + i·d_stride + j] = src[s_off + i·s_stride + j] for j < width, row i =
// row0 + workgroup y (backend.h copy_rows: the fused-projection splits and MLA's latent / query
// parts). Copied as 32-bit words: every float bit for bit, NaN payloads included.
layout(local_size_x = 64) in;
layout(std430, binding = 0) writeonly buffer Db { uint d[]; };
layout(std430, binding = 1) readonly buffer Sb { uint s[]; };
layout(std140, binding = 5) uniform P { uint width, d_stride, s_stride, d_off, s_off, row0; } p;
void main() {
    const uint i = p.row0 + gl_WorkGroupID.y;
    for (uint j = gl_GlobalInvocationID.x; j < p.width; j += gl_NumWorkGroups.x * 64u)
        d[p.d_off + i * p.d_stride + j] = s[p.s_off + i * p.s_stride + j];
}
