# man/man.mk: install targets for the man pages and the pipeline fragments, for the top
# Makefile to include (it sets PREFIX and DESTDIR):
#   install-man        man/rn-*.1 -> $(PREFIX)/share/man/man1/
#   install-pipelines  pipelines/{common,prep,train,eval,plot}.mk and their helper scripts ->
#                      $(PREFIX)/share/rn/pipelines/ (include them from there; the tools are
#                      then found on $PATH, or set RN_BIN)
PREFIX ?= /usr/local
RN_MAN_PAGES := $(wildcard man/rn-*.1)
RN_PIPELINE_FILES := $(addprefix pipelines/,common.mk prep.mk train.mk eval.mk plot.mk logrun.sh curves.sh)

.PHONY: install-man install-pipelines
install-man:
	install -d $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 644 $(RN_MAN_PAGES) $(DESTDIR)$(PREFIX)/share/man/man1/

install-pipelines:
	install -d $(DESTDIR)$(PREFIX)/share/rn/pipelines
	install -m 644 $(RN_PIPELINE_FILES) $(DESTDIR)$(PREFIX)/share/rn/pipelines/
