/* sdtool subcommands implemented outside sdtool_main.c: each takes argv[0] = its own name and returns an exit code. */
#ifndef SDTRAIN_COMMANDS_H
#define SDTRAIN_COMMANDS_H

#ifdef __cplusplus
extern "C" {
#endif

/* sdtool transform --resolution R [--exif-transpose] [--alpha drop|white] [--decode-only] IN OUT.png */
int sd_cmd_transform(int argc, char **argv);

/* sdtool inspect [--verify] [--no-stats] FILE.h5|SHARD_DIR (src/app/cmd_inspect.c) */
int sd_cmd_inspect(int argc, char **argv);

/* sdtool tokenize [--snapshot DIR | --vocab FILE.gz] [--file F [--escaped]] [CAPTION...]
 * (src/app/cmd_tokenize.c) */
int sd_cmd_tokenize(int argc, char **argv);

/* sdtool forward --snapshot DIR --module unet|vae-encode|vae-decode|text-encoder
 *     --in IN.safetensors --out OUT.safetensors [--threads N] [--repeat N] [--weights FILE]
 * (src/app/cmd_forward.c) */
int sd_cmd_forward(int argc, char **argv);
int sd_cmd_grad(int argc, char **argv);

/* sdtool make-demo-data DIR [--count N] [--seed S] [--format files|webdataset|tsv] [--bad]
 * (src/app/cmd_make_demo_data.c) */
int sd_cmd_make_demo_data(int argc, char **argv);

/* sdtool export --from SRC --out DIR [--ema] [--pretrained SNAPSHOT] [--nml FILE] [--force]
 * (src/app/cmd_export.c) */
int sd_cmd_export(int argc, char **argv);
/* sdtool single-file --snapshot DIR --out FILE [--dtype T] [--force] (src/app/cmd_single_file.c) */
int sd_cmd_single_file(int argc, char **argv);
/* sdtool import-single-file --file FILE --config SNAPSHOT --out DIR [--ema] [--force] */
int sd_cmd_import_single_file(int argc, char **argv);

/* sdtool plot METRICS.jsonl [--out PNG] [--metric a,b] [--smooth N] [--logy] [--text]
 * (src/app/cmd_plot.c) */
int sd_cmd_plot(int argc, char **argv);

/* sdtool filter --filter TEXT [--format F] [--max N] [--threads N] INPUT (src/app/cmd_filter.c) */
int sd_cmd_filter(int argc, char **argv);

/* sdtool score-demo --samples DIR [--captions FILE] [--json] (src/app/cmd_score_demo.c) */
int sd_cmd_score_demo(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
