"""The workflow examples of the original gswarm docs, verbatim (`gswarm workflow example` writes them)."""

from __future__ import annotations

EXAMPLES: dict[str, str] = {
    "simple-deployment": """\
name: "llama-deployment-pipeline"
description: "Download and serve Llama model"

actions:
  - action_id: "download_llama"
    action_type: "download"
    model_name: "llama-7b-chat"
    source_url: "https://huggingface.co/meta-llama/Llama-2-7b-chat-hf"
    devices: ["node1:disk"]
    dependencies: []

  - action_id: "move_to_gpu"
    action_type: "move"
    model_name: "llama-7b-chat"
    devices: ["node1:disk", "node1:gpu0"]  # from, to
    keep_source: true
    dependencies: ["download_llama"]

  - action_id: "serve_model"
    action_type: "serve"
    model_name: "llama-7b-chat"
    port: 8080
    devices: ["node1:gpu0"]
    dependencies: ["move_to_gpu"]

  - action_id: "health_check"
    action_type: "health_check"
    target_url: "http://node1:8080/health"
    devices: []
    dependencies: ["serve_model"]
""",
    "multi-model-deployment": """\
name: "multi-model-inference"
description: "Deploy multiple models for inference"

actions:
  # Download models in parallel
  - action_id: "download_llama"
    action_type: "download"
    model_name: "llama-7b"
    source_url: "https://huggingface.co/meta-llama/Llama-2-7b-hf"
    devices: ["node1:disk"]
    dependencies: []

  - action_id: "download_diffusion"
    action_type: "download"
    model_name: "stable-diffusion-xl"
    source_url: "https://huggingface.co/stabilityai/stable-diffusion-xl-base-1.0"
    devices: ["node2:disk"]
    dependencies: []

  # Load to different GPUs
  - action_id: "load_llama_gpu"
    action_type: "move"
    model_name: "llama-7b"
    devices: ["node1:disk", "node1:gpu0"]
    dependencies: ["download_llama"]

  - action_id: "load_diffusion_gpu"
    action_type: "move"
    model_name: "stable-diffusion-xl"
    devices: ["node2:disk", "node2:gpu0"]
    dependencies: ["download_diffusion"]

  # Serve both models
  - action_id: "serve_llama"
    action_type: "serve"
    model_name: "llama-7b"
    port: 8080
    devices: ["node1:gpu0"]
    dependencies: ["load_llama_gpu"]

  - action_id: "serve_diffusion"
    action_type: "serve"
    model_name: "stable-diffusion-xl"
    port: 8081
    devices: ["node2:gpu0"]
    dependencies: ["load_diffusion_gpu"]
""",
    "distributed-deployment": """\
name: "distributed-deployment"
description: "Deploy model across multiple nodes"

actions:
  # Download model to primary node
  - action_id: "download"
    action_type: "download"
    model_name: "llama-7b"
    target_device: "node1:disk"

  # Replicate to other nodes
  - action_id: "replicate_node2"
    action_type: "copy"
    model_name: "llama-7b"
    source_device: "node1:disk"
    target_device: "node2:disk"
    dependencies: ["download"]

  # Load models to GPUs
  - action_id: "load_gpu_node1"
    action_type: "move"
    model_name: "llama-7b"
    source_device: "node1:disk"
    target_device: "node1:gpu0"
    dependencies: ["download"]

  - action_id: "load_gpu_node2"
    action_type: "move"
    model_name: "llama-7b"
    source_device: "node2:disk"
    target_device: "node2:gpu0"
    dependencies: ["replicate_node2"]

  # Start services
  - action_id: "serve_node1"
    action_type: "serve"
    model_name: "llama-7b"
    device: "node1:gpu0"
    port: 8080
    dependencies: ["load_gpu_node1"]

  - action_id: "serve_node2"
    action_type: "serve"
    model_name: "llama-7b"
    device: "node2:gpu0"
    port: 8081
    dependencies: ["load_gpu_node2"]
""",
    "data-pipeline-chaining": """\
name: "ml-pipeline"
description: "Process data through multiple models"

actions:
  # Prepare input data
  - action_id: "load_data"
    action_type: "data_create"
    source: "s3://bucket/input"
    target_device: "node1:dram"

  # First model processing
  - action_id: "model1_process"
    action_type: "inference"
    model_name: "preprocessor"
    input_data: "${load_data.chunk_id}"
    output_device: "node1:dram"
    dependencies: ["load_data"]

  # Transfer intermediate data
  - action_id: "transfer_data"
    action_type: "data_transfer"
    data_id: "${model1_process.output}"
    target_device: "node2:dram"
    dependencies: ["model1_process"]

  # Second model processing
  - action_id: "model2_process"
    action_type: "inference"
    model_name: "classifier"
    input_data: "${transfer_data.chunk_id}"
    output_device: "node2:dram"
    dependencies: ["transfer_data"]
""",
    "model-deployment-with-data": """\
name: "model-deployment-with-data"
description: "Deploy model and setup data pipeline"

actions:
  # Download model
  - action_id: "download_model"
    action_type: "download"
    model_name: "llama-7b"
    source_url: "https://huggingface.co/meta-llama/Llama-2-7b"
    target_device: "node1:disk"
    priority: "high"
    dependencies: []

  # Prepare input data
  - action_id: "prepare_data"
    action_type: "data_create"
    data_type: "input"
    source: "s3://bucket/input-data"
    target_device: "node1:dram"
    dependencies: []

  # Load model to GPU
  - action_id: "load_model"
    action_type: "move"
    model_name: "llama-7b"
    source_device: "node1:disk"
    target_device: "node1:gpu0"
    keep_source: true
    dependencies: ["download_model"]

  # Start model service
  - action_id: "start_service"
    action_type: "serve"
    model_name: "llama-7b"
    device: "node1:gpu0"
    port: 8080
    dependencies: ["load_model"]

  # Process data
  - action_id: "process_data"
    action_type: "inference"
    service_url: "http://node1:8080"
    input_data_id: "${prepare_data.output.chunk_id}"
    output_device: "node1:dram"
    dependencies: ["start_service", "prepare_data"]

  # Transfer results to next node
  - action_id: "transfer_results"
    action_type: "data_transfer"
    data_id: "${process_data.output.chunk_id}"
    target_node: "node2"
    target_device: "node2:dram"
    dependencies: ["process_data"]
""",
    "multi-stage-pipeline": """\
name: "multi-stage-pipeline"
description: "Complex pipeline with parallel execution"

queue_config:
  max_concurrent_tasks: 4
  enable_resource_tracking: true

actions:
  # Stage 1: Parallel model downloads
  - action_id: "download_llm"
    action_type: "download"
    model_name: "llama-7b"
    target_device: "node1:disk"
    priority: "high"
    dependencies: []

  - action_id: "download_vision"
    action_type: "download"
    model_name: "clip-vit-large"
    target_device: "node2:disk"
    priority: "high"
    dependencies: []

  # Stage 2: Data preparation (can run in parallel with downloads)
  - action_id: "prepare_text_data"
    action_type: "data_create"
    source: "s3://bucket/text-data"
    target_device: "node1:dram"
    dependencies: []

  - action_id: "prepare_image_data"
    action_type: "data_create"
    source: "s3://bucket/image-data"
    target_device: "node2:dram"
    dependencies: []

  # Stage 3: Model deployment
  - action_id: "deploy_llm"
    action_type: "serve"
    model_name: "llama-7b"
    device: "node1:gpu0"
    dependencies: ["download_llm"]

  - action_id: "deploy_vision"
    action_type: "serve"
    model_name: "clip-vit-large"
    device: "node2:gpu0"
    dependencies: ["download_vision"]

  # Stage 4: Processing pipeline
  - action_id: "process_text"
    action_type: "inference"
    service: "${deploy_llm.service_url}"
    input: "${prepare_text_data.chunk_id}"
    output_device: "node1:dram"
    dependencies: ["deploy_llm", "prepare_text_data"]

  - action_id: "process_images"
    action_type: "inference"
    service: "${deploy_vision.service_url}"
    input: "${prepare_image_data.chunk_id}"
    output_device: "node2:dram"
    dependencies: ["deploy_vision", "prepare_image_data"]

  # Stage 5: Combine results
  - action_id: "combine_results"
    action_type: "data_merge"
    inputs: ["${process_text.output}", "${process_images.output}"]
    output_device: "node1:dram"
    dependencies: ["process_text", "process_images"]
""",
}
