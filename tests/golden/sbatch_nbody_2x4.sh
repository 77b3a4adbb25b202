#!/bin/bash

# Parameters
#SBATCH --account=cosmo
#SBATCH --constraint=a100
#SBATCH --cpus-per-task=8
#SBATCH --exclusive
#SBATCH --gpus-per-node=4
#SBATCH --job-name=pmpipe-nbody-big-fiducial-r0
#SBATCH --mem=26089M
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --open-mode=append
#SBATCH --output=/scratch/pmpipe/logs/%j_0_log.out
#SBATCH --partition=gpu
#SBATCH --qos=normal
#SBATCH --signal=USR2@150
#SBATCH --time=10
#SBATCH --wckey=submitit

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /scratch/pmpipe/logs/%j_%t_log.out --kill-on-bad-exit=1 python -u -m submitit.core._submit /scratch/pmpipe/logs
