# Two commands on a fresh machine (Python 3.10+):
#   make demo   set up .venv, prepare the bundled demo corpus, train briefly, write a model and a WAV
#   make test   set up .venv and run the test suite (CPU, offline)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_DIR := demo/work

.PHONY: demo demo-feedback test setup clean-demo

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10+ is needed; set PYTHON=python3.x")'
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: requirements.txt | $(BIN)/python
	$(BIN)/python -m pip install -r requirements.txt
	touch $@

setup: $(VENV)/.installed

# The demo: a tiny VITS from scratch on the bundled corpus for 3 minutes (0.05 h) on whatever device is
# there, with a small discriminator; each run starts fresh.
demo: setup
	$(BIN)/python prepare_data.py --input_dir demo/corpus --data_dir $(DEMO_DIR)/data --model_name scratch:tiny
	rm -rf $(DEMO_DIR)/checkpoints $(DEMO_DIR)/final_model
	$(BIN)/python train_vits.py --data_dir $(DEMO_DIR)/data --checkpoint_dir $(DEMO_DIR)/checkpoints \
		--output_dir $(DEMO_DIR)/final_model --model_name scratch:tiny --target_hours 0.05 \
		--discriminator_width 0.0625 --learning_rate 2e-3 --gradient_accumulation_steps 1 --log_every_seconds 15
	$(BIN)/python synthesize.py --model $(DEMO_DIR)/final_model --text "Rojbaş, tu çawa yî? Ez baş im." \
		--out $(DEMO_DIR)/demo.wav
	@echo
	@echo "Demo done: model in $(DEMO_DIR)/final_model, speech in $(DEMO_DIR)/demo.wav,"
	@echo "best model, samples and logs in $(DEMO_DIR)/checkpoints. Three minutes of CPU training makes a"
	@echo "voice-like buzz, not speech: the point is the whole pipeline, end to end."

# The feedback workflow on the demo model (after `make demo`; needs espeak-ng, which "records" the
# corrections): review four sentences the corpus never spoke, correct them, a 3-minute round.
demo-feedback: setup
	@test -f $(DEMO_DIR)/checkpoints/best_model/config.json || (echo "run make demo first"; exit 1)
	rm -rf $(DEMO_DIR)/review $(DEMO_DIR)/feedback $(DEMO_DIR)/voices
	head -4 demo/corpus/unspoken.txt > $(DEMO_DIR)/review.txt
	$(BIN)/python train_feedback.py --base_model $(DEMO_DIR)/checkpoints/best_model --review $(DEMO_DIR)/review.txt \
		--review_dir $(DEMO_DIR)/review
	$(BIN)/python demo/record_corrections.py --review_dir $(DEMO_DIR)/review --feedback_dir $(DEMO_DIR)/feedback
	$(BIN)/python train_feedback.py --feedback_dir $(DEMO_DIR)/feedback --data_dir $(DEMO_DIR)/data \
		--output_dir $(DEMO_DIR)/voices --base_model $(DEMO_DIR)/checkpoints/best_model --target_minutes 3 \
		--learning_rate 5e-4 --log_every_seconds 30
	@echo
	@echo "Listen: $(DEMO_DIR)/voices/rounds/round_001/listen/; undo an accepted round with"
	@echo "  $(BIN)/python train_feedback.py --output_dir $(DEMO_DIR)/voices --rollback previous"

test: setup
	$(BIN)/python -m pytest -q

clean-demo:
	rm -rf $(DEMO_DIR)
