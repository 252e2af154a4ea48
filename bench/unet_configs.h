/* U-Net shapes shared by the benchmarks (bench/unet_cpu.c, bench/train_step.c). */
#ifndef SDTRAIN_BENCH_UNET_CONFIGS_H
#define SDTRAIN_BENCH_UNET_CONFIGS_H

#include "sdtrain/models.h"

/* The tiny-sd2 configuration of tests/reference/make_model_goldens.py. */
static inline void bench_tiny_unet_config(sd_unet_config *c)
{
    sd_unet_config_sd2_base(c);
    c->n_levels = 2;
    c->block_out_channels[0] = 16;
    c->block_out_channels[1] = 32;
    c->down_cross[0] = 1;
    c->down_cross[1] = 0;
    c->up_cross[0] = 0;
    c->up_cross[1] = 1;
    c->heads[0] = 2;
    c->heads[1] = 4;
    c->transformer_layers[0] = c->transformer_layers[1] = 1;
    c->cross_attention_dim = 32;
    c->norm_num_groups = 8;
    c->sample_size = 8;
}

/* SD2-base's shape at 0.8x the width (256, 512, 1024, 1024 channels, heads of 64 as SD2's):
 * 0.64x the parameters, for the benchmarks whose copies of the SD2 state do not fit the
 * development VM's memory beside each other (bench/ckpt_io --async). */
static inline void bench_sd2_narrow_unet_config(sd_unet_config *c)
{
    static const int boc[4] = {256, 512, 1024, 1024}, heads[4] = {4, 8, 16, 16};
    sd_unet_config_sd2_base(c);
    for (int i = 0; i < 4; i++) {
        c->block_out_channels[i] = boc[i];
        c->heads[i] = heads[i];
    }
}

#endif
