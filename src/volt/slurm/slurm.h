// volt::slurm, the torch-free SLURM tools: hostlists, sbatch job scripts and their checks
// against the Trainer, and hyperparameter sweeps run as job arrays.
#pragma once

#include "volt/slurm/hostlist.h"
#include "volt/slurm/job_check.h"
#include "volt/slurm/job_spec.h"
#include "volt/slurm/sweep.h"
