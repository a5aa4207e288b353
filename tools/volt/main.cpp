// `volt`: SLURM job scripts, their checks and sweeps for Volt Trainer programs. See cli.h.
#include "cli.h"

int main(int argc, char** argv) { return volt::tool::run_volt_tool(argc, argv); }
